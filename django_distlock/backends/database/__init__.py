"""Database backend: one row per lock name in the app's own table.

Every lock is a row of :class:`~django_distlock.models.LockRecord`, keyed by
a SHA-256 digest of ``(KEY_PREFIX, name)``. Each thread of a process talks
to the database through a connection of its own, opened with Django's own
machinery from the ``DATABASES`` entry but never shared with the ORM, so an
acquisition never runs inside, commits or rolls back the caller's
transaction.

The hot path is one raw SQL statement per operation, in autocommit:

- acquire: ``UPDATE ... SET token, fence = fence + 1, expires_at = now + ttl
  WHERE digest = ... AND (token IS NULL OR expires_at <= now)``, returning the
  new fence (``RETURNING`` on PostgreSQL and SQLite, ``LAST_INSERT_ID(expr)``
  on MySQL/MariaDB). The UPDATE takes the same row lock a ``SELECT ... FOR
  UPDATE`` would, for one statement instead of a four-statement transaction.
  A miss is followed by a probe that tells "busy for N more seconds" from
  "no row yet"; the row is then created in a short transaction (a unique
  digest and ``ON CONFLICT DO NOTHING`` settle the race between creators).
- release, extend, force release: owner-checked conditional UPDATEs.

On PostgreSQL the statements are prepared once per connection, and a release
does not wait for the WAL flush (losing one in a crash only delays the lock's
expiry).

Expiry is compared with the database's clock (``clock_timestamp()``,
``UTC_TIMESTAMP(6)``, SQLite's ``'now'``), never the app server's, so clock
skew between app servers does not matter. Waiting is polling with jittered
exponential backoff (capped by ``OPTIONS["MAX_BACKOFF"]``, 50 ms) that also
wakes up when the holder's lease runs out; on PostgreSQL,
``OPTIONS["WAIT"] = "notify"`` makes waiters sleep on LISTEN until a
release's NOTIFY instead. Semaphore waiters never poll on PostgreSQL (a
release hands them their permits), on MariaDB (a release interrupts their
wait in the database) nor on a SQLite file on Linux (a release sends them
a datagram). The polling loop is written once, as a generator of steps (an
attempt, a sleep) that a synchronous and an asyncio executor drive, as in
:mod:`..steps`, so ``acquire`` and ``aacquire`` cannot drift apart.

See ``docs/backends/database.md`` for the guarantees per database.

Shared locks and semaphore permits add one row per holder (and per queued
waiter) in a second table, ``LockShare``, under the name's row, which every
change to them locks first (:mod:`.shares`).

The package: :mod:`.names` (stored names, row keys), :mod:`.dialects` (the
SQL per vendor), :mod:`.connections` (one connection per thread),
:mod:`.waiting` (polling, LISTEN/NOTIFY, cancelled waiters), :mod:`.bells`
(waking SQLite's permit waiters), :mod:`.shares`
(shared locks and semaphores), :mod:`.checks` (system checks) and
:mod:`.backend` (the contract).
"""

from .backend import DatabaseLockBackend
from .connections import _can_prepare as _can_prepare  # the tests import it here
from .dialects import FLOOR
from .names import decode_name, encode_name, record_digest

__all__ = [
    "FLOOR",
    "DatabaseLockBackend",
    "decode_name",
    "encode_name",
    "record_digest",
]

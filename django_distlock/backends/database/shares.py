"""Shared locks and semaphore permits of the database backend.

A shared lock keeps the lock's own row (``LockRecord``): while shared
holders have it, its ``token`` is :data:`.dialects.SHARED_MARK` and its
``expires_at`` the latest expiry among them, so the exclusive hot path (one
conditional UPDATE) finds it taken without knowing about shares. Each shared
holder is a row of ``LockShare`` with its own token and expiry. A semaphore
is a row of its own (a digest apart from every lock's), marked
:data:`.dialects.PERMITS_MARK` while permits are out, one ``LockShare`` row
per permit.

Every change to the holders of a name runs in one transaction that first
locks the name's row (``SELECT ... FOR UPDATE``; on SQLite, ``BEGIN
IMMEDIATE`` locks the file), so two acquirers never both see room. On
PostgreSQL, taking and giving back a shared lease or a permit are each one
call of a function that migration 0004 installs: the same steps, run inside
the server in one round trip instead of about eight with the row locked.

Queues, as rows that expire unless their waiter renews them at each attempt
(:data:`WAITER_TTL`), so a dead waiter holds nobody up for long:

- writer preference: an exclusive waiter that finds shared holders leaves a
  ``writer`` row; shared requests wait while one lives;
- permits are granted in FIFO order: a waiter leaves a ``queued`` row and is
  granted a permit only when the holders and the waiters queued before it
  leave one free.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

from ...exceptions import LockBackendError
from ..base import Holder, Lease
from ..kinds import SHARED, Kind, limit_mismatch, permit
from .bells import rings
from .deadlines import LISTING_DEADLINE
from .dialects import PERMITS_MARK, SHARED_MARK
from .names import decode_name, encode_name
from .waiting import _channel

__all__ = ["WAITER_TTL", "SharesMixin"]

#: Seconds a waiter's place in a queue lasts unless its next attempt renews
#: it; longer than any pause between two attempts (polling stops at
#: ``MAX_BACKOFF``, a notified waiter tries again at least every second).
WAITER_TTL = 2.0
#: The wait suggested to a request that queues behind others, seconds.
QUEUED_HINT = 0.005


def permit_digest(namespace: str, name: str) -> str:
    """Return the row key of semaphore ``name``: never a lock's row key.

    Lock rows hash ``"<length>:<namespace>:<name>"``, which starts with a
    digit; this starts with ``"permit:"``.
    """
    raw = f"permit:{len(namespace)}:{namespace}:{name}"
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()


def _no_share_table(exc: Exception) -> bool:
    """Return True if ``exc`` says the share table does not exist."""
    if "lockshare" not in str(exc).lower():
        return False
    code = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
    if code == "42P01":  # PostgreSQL: undefined table
        return True
    if exc.args and exc.args[0] == 1146:  # MySQL/MariaDB: no such table
        return True
    return "no such table" in str(exc)  # SQLite


class SharesMixin:
    """The shared-lock and semaphore half of the database backend."""

    alias: str
    key_prefix: str
    max_backoff: float
    wait_notify: bool
    _handover: bool
    _wakes: Any
    _rings: bool | None
    _bell: Any
    _bells: Any
    _ring: Any
    _call: Any
    _statement: Any
    _transaction: Any
    _dialect: Any
    _digest: Any
    _handover_channel: Any

    def _init_shares(self) -> None:
        #: Tokens of this process's waiters that hold a place in a queue.
        self._queued: set[str] = set()

    def _waiter_ttl(self) -> float:
        return max(WAITER_TTL, 4 * self.max_backoff)

    def _kind_digest(self, name: str, kind: Kind) -> str:
        if kind.mode == "permit":
            return permit_digest(self.key_prefix, name)
        return self._digest(name)

    @staticmethod
    def _share_kind(kind: Kind) -> Kind:
        """Return ``kind`` checked (SHARED itself for a shared one)."""
        if kind.mode == "shared":
            return SHARED
        if kind.mode == "permit":
            limit = kind.limit
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise ValueError(
                    f"A semaphore's limit must be a positive integer, not {limit!r}."
                )
            return kind
        if kind.mode == "exclusive":
            raise AssertionError("exclusive acquisitions take the lock's own path")
        raise ValueError(f"The database lock backend has no {kind.mode!r} kind.")

    @staticmethod
    def _mark(mode: str) -> str:
        return PERMITS_MARK if mode == "permit" else SHARED_MARK

    # -- acquiring --------------------------------------------------------

    def _locked_row(self, cur: Any, digest: str) -> tuple | None:
        """Lock the row of ``digest``; return its state, or None if it has none.

        ``(token, live, remaining seconds, fence)``.
        """
        self._statement(cur, "row_locked", (digest,))
        rows = cur.fetchall()
        return rows[0] if rows else None

    def _create_row(self, cursor: Any, name: str, digest: str) -> None:
        """Create the free row of ``digest``, in a transaction of its own.

        Not in the transaction that then locks the row: on InnoDB an INSERT
        that meets the row as a duplicate key holds a shared lock on it, and
        two such transactions asking for the row lock deadlock.
        """

        def create(cur: Any) -> None:
            params = (digest, self.key_prefix, encode_name(name), self._floor(cur))
            self._statement(cur, "create_free", params)

        self._transaction(cursor, create)

    def _attempt_share(
        self,
        cursor: Any,
        name: str,
        digest: str,
        token: str,
        ttl: float,
        identity: tuple[str, int, str],
        kind: Kind,
    ) -> tuple[int | None, float]:
        """Try once for a shared lease or a permit, in one transaction."""
        if self._dialect.share_functions:
            host, pid, thread = identity
            params = (
                digest,
                self.key_prefix,
                encode_name(name),
                kind.mode,
                kind.limit,
                token,
                host,
                pid,
                thread,
                float(ttl),
                self._waiter_ttl(),
                QUEUED_HINT,
                self._handover_channel(cursor) if kind.mode == "permit" else None,
            )
            return self._grant_in_server(cursor, params, name, token, kind)

        def grant(cur: Any) -> tuple[int | None, float] | None:
            run = self._statement
            row = self._locked_row(cur, digest)
            if row is None:
                return None
            holder, live, remaining, fence = row
            fence = int(fence)
            run(cur, "shares_purge", (digest,))
            if kind.mode == "permit":
                handed = self._handed(cur, digest, token)
                if handed is not None:
                    return handed, 0.0
                waited = self._permit_room(
                    cur, name, digest, token, identity, kind, ttl
                )
                if waited is not None:
                    return None, waited
                fence += 1  # each permit a fencing token of its own
            else:
                if live and holder != SHARED_MARK:
                    return None, max(QUEUED_HINT, float(remaining or 0.0))
                run(cur, "writers_waiting", (digest,))
                writers = cur.fetchall()
                if writers:
                    return None, max(QUEUED_HINT, min(float(w[0]) for w in writers))
            ttl_p = self._dialect.ttl_param(ttl)
            host, pid, thread = identity
            run(
                cur,
                "share_insert",
                (digest, kind.mode, kind.limit, token, fence, host, pid, thread)
                + (None, None, ttl_p),
            )
            mark = self._mark(kind.mode)
            run(cur, "mark", (mark, ttl_p, ttl_p, mark, fence, digest))
            return fence, 0.0

        result = self._transaction(cursor, grant)
        if result is None:  # the name's first holder (or clear_stale() took the row)
            self._create_row(cursor, name, digest)
            result = self._transaction(cursor, grant)
            if result is None:
                raise LockBackendError(
                    f"Database lock backend {self.alias!r}: the row of {name!r} "
                    "vanished twice while it was being created."
                )
        if result[0] is not None:
            self._queued.discard(token)
        return result

    def _grant_in_server(
        self, cursor: Any, params: tuple, name: str, token: str, kind: Kind
    ) -> tuple[int | None, float]:
        """Try once, by one call of the server's function (PostgreSQL)."""
        self._statement(cursor, "share_acquire", params)
        fence, wait, other = cursor.fetchall()[0]
        if other is not None:
            raise limit_mismatch(name, other, kind.limit)
        if fence is None:
            if kind.mode == "permit":
                self._queued.add(token)  # the function kept its place
            return None, float(wait)
        self._queued.discard(token)
        return int(fence), 0.0

    def _handed(self, cur: Any, digest: str, token: str) -> int | None:
        """Return the fence of the permit a release handed ``token``'s place
        meanwhile (SQLite), or None."""
        if self._bells is None or token not in self._queued:
            return None
        self._statement(cur, "place_granted", (digest, token))
        rows = cur.fetchall()
        return int(rows[0][0]) if rows else None

    def _permit_room(
        self,
        cur: Any,
        name: str,
        digest: str,
        token: str,
        identity: tuple[str, int, str],
        kind: Kind,
        ttl: float,
    ) -> float | None:
        """Return None if a permit is free for ``token``, else a wait hint.

        A waiter without room keeps (or takes) its place in the queue.
        """
        run = self._statement
        run(cur, "permit_limits", (digest, kind.limit))
        others = cur.fetchall()
        if others:
            raise limit_mismatch(name, others[0][0], kind.limit)
        run(cur, "permit_count", (digest,))
        held, soonest = cur.fetchall()[0]
        run(cur, "queue_ahead", (digest, digest, token))
        ahead = int(cur.fetchall()[0][0])
        if int(held) + ahead < kind.limit:
            if token in self._queued:
                run(cur, "share_delete", (digest, token))
            return None
        self._hold_place(cur, digest, token, identity, "queued", kind.limit, ttl)
        if soonest is None and self._rings:
            # Permits are free, for the waiters ahead, who take them; a
            # release or a withdrawal ahead rings this waiter when it has
            # room. It renews its place before the place can expire.
            return self._waiter_ttl() / 2
        return max(QUEUED_HINT, float(soonest or 0.0))

    def _hold_place(
        self,
        cursor: Any,
        digest: str,
        token: str,
        identity: tuple[str, int, str],
        mode: str,
        limit: int | None = None,
        ttl: float | None = None,
    ) -> None:
        """Keep ``token``'s place in the queue of ``digest`` for a while.

        A permit waiter with a bell (SQLite) is handed its permit, of
        ``ttl`` seconds, by the release that frees it.
        """
        ttl_p = self._dialect.ttl_param(self._waiter_ttl())
        wakes = mode == "queued" and self._wakes(cursor)
        bell = self._bell(cursor) if wakes else None
        if bell is None or self._bells is None:
            ttl = None
        if token in self._queued:
            self._statement(cursor, "share_refresh", (ttl_p, bell, digest, token))
            if cursor.rowcount == 1:
                return
            # Purged after it expired: queue again, at the back.
            self._statement(cursor, "share_delete", (digest, token))
        host, pid, thread = identity
        self._statement(
            cursor,
            "share_insert",
            (digest, mode, limit, token, 0, host, pid, thread, bell, ttl, ttl_p),
        )
        self._queued.add(token)

    def _queue_writer(
        self, cursor: Any, digest: str, token: str, identity: tuple[str, int, str]
    ) -> None:
        """Queue an exclusive waiter that found shared holders (autocommit)."""
        self._hold_place(cursor, digest, token, identity, "writer")

    def _leave_queue(self, cursor: Any, digest: str, token: str) -> None:
        """Drop the place of a waiter just granted its lease.

        A failure is left alone: the place expires within seconds.
        """
        try:
            self._withdraw_once(cursor, digest, token)
        except Exception:  # noqa: BLE001 - the lease is granted either way
            pass

    def _withdraw_once(
        self, cursor: Any, digest: str, token: str, wake: bool = False
    ) -> None:
        self._queued.discard(token)
        if wake and (self._dialect.share_functions or self._bells is not None):
            # The release also gives back a permit handed over meanwhile,
            # and grants the room to the next in line.
            self._release_share_once(cursor, digest, token)
            return
        self._statement(cursor, "share_delete", (digest, token))
        if not (wake and cursor.rowcount == 1):
            return
        if self._wakes(cursor):
            # Permit waiters queued behind this one may have room now.
            self._ring(cursor, digest)
        elif self.wait_notify:
            # Readers queued behind a writer that gave up may go now.
            self._statement(cursor, "notify", (_channel(digest),))
            cursor.fetchall()

    # -- releasing, extending, checking -----------------------------------

    def _unshare(
        self, cur: Any, digest: str, token: str, wakes: bool = False
    ) -> tuple[bool, bool, bool, list[tuple[str, bytes]]]:
        """Remove the holder or waiter ``token``.

        Return ``(found, was live, waiters queued, grants)``; the last two
        only if ``wakes``. On SQLite the free permits are handed to the
        waiters first in line: ``grants`` are the messages for their bells,
        to send once the transaction has committed. Inside a transaction:
        the name's row is locked first. SQLite and MariaDB only: PostgreSQL
        releases through ``distlock_share_release``.
        """
        run = self._statement
        if wakes:
            run(cur, "row_locked_waiting", (digest, digest))
        else:
            run(cur, "row_locked", (digest,))
        locked = cur.fetchall()
        waiting = wakes and bool(locked) and bool(locked[0][0])
        run(cur, "share_live", (token, digest))
        rows = cur.fetchall()
        if not rows:
            return False, False, waiting, []
        live, mode = rows[0]
        run(cur, "share_delete", (digest, token))
        if mode in ("shared", "permit"):
            mark = self._mark(mode)
            run(cur, "unmark", (digest, mode, digest, mode, digest, mark))
        grants = []
        if waiting and self._bells is not None and mode in ("permit", "queued"):
            grants = self._hand_over(cur, digest, int(locked[0][1]))
        return True, bool(live), waiting, grants

    def _hand_over(self, cur: Any, digest: str, fence: int) -> list[tuple[str, bytes]]:
        """Grant the free permits of ``digest`` to the waiters first in line.

        SQLite, inside the release's transaction; ``fence`` is the name's
        last fencing token. Return the message for each waiter's bell: its
        token and its permit's fencing token. A waiter whose bell nobody has
        bound any more has gone: its place is dropped. One queued by an
        earlier version (no ``ttl``) is only woken, and takes the permit.
        """
        run = self._statement
        run(cur, "permit_queue", (digest,))
        queue = cur.fetchall()
        if not queue:  # the one queued was the release's own place
            return []
        run(cur, "permit_count", (digest,))
        room = max(int(row[4] or 0) for row in queue) - int(cur.fetchall()[0][0])
        messages = []
        for place, waiter, ttl, bell, _limit in queue:
            if room <= 0:
                break
            if not rings(bell):
                run(cur, "place_drop", (place,))
                continue
            room -= 1
            if bell is None or ttl is None:
                if bell is not None:
                    messages.append((bell, b""))
                continue
            fence += 1
            ttl_p = self._dialect.ttl_param(ttl)
            run(cur, "place_grant", (fence, ttl_p, place))
            run(cur, "mark", (PERMITS_MARK, ttl_p, ttl_p, PERMITS_MARK, fence, digest))
            messages.append((bell, f"{waiter} {fence}".encode()))
        return messages

    def _release_share_once(
        self, cursor: Any, digest: str, token: str, permit: bool = True
    ) -> tuple[bool, bool]:
        # ``permit``: it may be a permit or a permit waiter's place, which
        # the release function hands on when permits are handed over; a
        # shared lease wakes its waiters only when they listen (WAIT).
        if self._dialect.share_functions:
            wake = self.wait_notify or (permit and self._handover)
            channel = _channel(digest) if wake else None
            self._statement(cursor, "share_release", (digest, token, channel))
            found, live = cursor.fetchall()[0]
            return bool(found), bool(live)
        wakes = permit and self._wakes(cursor)
        found, live, waiting, grants = self._transaction(
            cursor, lambda cur: self._unshare(cur, digest, token, wakes)
        )
        # Once the release has committed (SQLite's grants, MariaDB's wake):
        if grants:
            self._bells.ring(grants)
        elif waiting and self._bells is None:
            self._ring(cursor, digest)
        return found, live

    def _release_share(self, lease: Lease) -> bool:
        found, live = self._call(
            "release",
            self._release_share_once,
            self._lease_digest(lease),
            lease.token,
            lease.kind.mode == "permit",
        )
        return found and live

    def _drop_share_once(self, cursor: Any, digest: str, token: str) -> bool:
        found, _live = self._release_share_once(cursor, digest, token)
        return found

    def _drop_any_once(self, cursor: Any, digest: str, token: str) -> bool:
        """Drop whatever ``token`` holds of ``digest``: lease, share or place."""
        if self._drop_once(cursor, digest, token):
            return True
        self._queued.discard(token)
        return self._drop_share_once(cursor, digest, token)

    def _extend_share_once(
        self, cursor: Any, digest: str, token: str, mode: str, ttl: float
    ) -> bool:
        ttl_p = self._dialect.ttl_param(ttl)

        def extend(cur: Any) -> bool:
            run = self._statement
            run(cur, "row_locked", (digest,))
            cur.fetchall()
            run(cur, "share_extend", (ttl_p, token, digest, mode))
            if cur.rowcount != 1:
                return False
            run(cur, "mark_extend", (ttl_p, digest, self._mark(mode), ttl_p))
            return True

        return self._transaction(cursor, extend)

    def _extend_share(self, lease: Lease, ttl: float) -> bool:
        return self._call(
            "extend",
            self._extend_share_once,
            self._lease_digest(lease),
            lease.token,
            lease.kind.mode,
            ttl,
        )

    def _share_is_held_once(
        self, cursor: Any, digest: str, token: str, mode: str
    ) -> bool:
        self._statement(cursor, "share_is_held", (token, digest, mode))
        return bool(cursor.fetchall())

    def _share_is_held(self, lease: Lease) -> bool:
        return self._call(
            "check",
            self._share_is_held_once,
            self._lease_digest(lease),
            lease.token,
            lease.kind.mode,
        )

    def _renew_mixed(self, leases: list[Lease]) -> list[bool | None]:
        """Renew exclusive leases in one batch, the others one by one."""
        results: list[bool | None] = [None] * len(leases)
        exclusive = [i for i, lease in enumerate(leases) if lease.kind.exclusive]
        if exclusive:
            batch = self.renew([leases[i] for i in exclusive])
            for i, ok in zip(exclusive, batch):
                results[i] = ok
        for i, lease in enumerate(leases):
            if lease.kind.exclusive:
                continue
            try:
                results[i] = self.extend(lease, lease.ttl)
            except Exception:  # noqa: BLE001 - reported as None, as renew() does
                results[i] = None
        return results

    def _force_release_share(self, name: str, token: str, kind: Kind) -> bool:
        return self._call(
            "force-release",
            self._drop_share_once,
            self._kind_digest(name, kind),
            token,
        )

    # -- listing and clearing ---------------------------------------------

    def _share_rows(self, cursor: Any, prefix: str) -> list[tuple]:
        stored = encode_name(prefix)
        try:
            self._statement(
                cursor, "share_holders", (self.key_prefix, len(stored), stored)
            )
        except Exception as e:
            if _no_share_table(e):
                return []  # migration 0003 not run yet: exclusive locks only
            raise
        return list(cursor.fetchall())

    def _share_holders(self, prefix: str) -> Iterator[Holder]:
        rows = self._call(
            "list locks", self._share_rows, prefix, deadline=LISTING_DEADLINE
        )
        when = datetime.fromtimestamp
        utc = timezone.utc
        for row in rows:
            name, token, host, pid, thread, acquired, expires, fence, mode, limit = row
            name = decode_name(name)
            if not name.startswith(prefix):
                continue  # a padding collation (see migration 0002)
            yield Holder(
                backend=self.alias,
                name=name,
                token=token,
                host=host,
                pid=pid,
                thread=thread,
                acquired_at=None if acquired is None else when(float(acquired), utc),
                expires_at=when(float(expires), utc),
                fencing_token=int(fence),
                kind=permit(int(limit)) if mode == "permit" else SHARED,
            )

    def _clear_stale_shares(self, cursor: Any) -> int:
        """Delete expired shared leases, permits and places; count the leases."""
        try:
            self._statement(cursor, "stale_waiters", (self.key_prefix,))
        except Exception as e:
            if _no_share_table(e):
                return 0  # migration 0003 not run yet: nothing to clear
            raise
        self._statement(cursor, "stale_holders", (self.key_prefix,))
        return max(0, cursor.rowcount)

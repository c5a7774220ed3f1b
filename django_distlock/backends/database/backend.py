"""The database lock backend: one row per lock name in the app's own table."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone
from typing import Any

from asgiref.sync import sync_to_async

from ...exceptions import LockBackendError
from ..base import Holder, Lease, holder_identity
from ..handoff import Handoff
from ..kinds import EXCLUSIVE, Kind
from ..options import Choice, DatabaseAlias, Seconds
from ..steps import StepsBackend
from .checks import DEFAULT_MAX_BACKOFF, check_database
from .connections import ConnectionsMixin
from .deadlines import LISTING_DEADLINE
from .dialects import Dialect
from .names import decode_name, encode_name, record_digest
from .shares import SharesMixin
from .waiting import WaitingMixin, _channel

__all__ = ["DatabaseLockBackend"]

#: Rows deleted per statement by :meth:`DatabaseLockBackend.clear_stale`.
DELETE_CHUNK = 500


class DatabaseLockBackend(SharesMixin, WaitingMixin, ConnectionsMixin, StepsBackend):
    """Locks as rows of a table in one of the project's databases.

    ``OPTIONS["DATABASE"]`` names the ``DATABASES`` alias (default
    ``"default"``); PostgreSQL, MySQL/MariaDB and SQLite (3.35+) are
    supported. ``OPTIONS["MAX_BACKOFF"]`` caps the sleep between two polls
    of a busy lock (seconds, default 0.05). On PostgreSQL,
    ``OPTIONS["WAIT"] = "notify"`` makes waiters sleep until a release's
    ``NOTIFY`` (or the holder's expiry) instead of polling; every process
    using the table should then set it. ``KEY_PREFIX`` separates the locks
    of aliases that share one table. Shared locks and semaphore permits are
    rows of a second table (see :mod:`.shares`); on PostgreSQL a permit's
    release hands it to the first waiter in line (:attr:`hands_over`).
    """

    kinds = frozenset({"exclusive", "shared", "permit"})
    options_schema = {
        "DATABASE": DatabaseAlias(
            "Name a DATABASES alias (default 'default') whose "
            "database has the django_distlock migrations applied.",
            default="default",
        ),
        "MAX_BACKOFF": Seconds(
            "The default, 0.05, makes a waiter notice a release within about 50 ms."
        ),
        "WAIT": Choice(
            "'notify' (PostgreSQL only) wakes waiters with "
            "LISTEN/NOTIFY instead of polling.",
            choices=("poll", "notify"),
        ),
    }

    def __init__(self, alias: str, params: dict[str, Any]):
        super().__init__(alias, params)
        self.database = str(self.options.get("DATABASE", "default"))
        self.max_backoff = float(self.options.get("MAX_BACKOFF", DEFAULT_MAX_BACKOFF))
        self.wait_notify = self.options.get("WAIT", "poll") == "notify"
        self._init_connections()
        self._init_shares()

    @classmethod
    def check_entry(cls, alias: str, params: dict[str, Any]) -> list:
        """Check that the backend can use the database, and its WAIT there."""
        return check_database(alias, params)

    @property
    def listens(self) -> bool:
        """Whether waiters sleep on LISTEN until a release's NOTIFY.

        True with ``OPTIONS["WAIT"] = "notify"``, unless the database sits
        behind a transaction pooler (``DISABLE_SERVER_SIDE_CURSORS``): LISTEN
        belongs to a server session, which such a pooler hands to other
        clients after each transaction, so waiters poll there (releases still
        notify, for the processes that reach PostgreSQL directly).
        """
        if self._dialect is None:
            self._setup()
        return self.wait_notify and not self._pooled

    @property
    def hands_over(self) -> bool:
        """Whether a permit's release hands it to the first waiter in line.

        On PostgreSQL reached directly through psycopg 3.2+, whatever
        ``WAIT`` says: a permit waiter sleeps on LISTEN until a release
        grants it its permit (migration 0006), so semaphores never poll. On
        a SQLite file on Linux: the grant goes to the waiter's bell
        (:mod:`.bells`). On MariaDB a release wakes the waiters it frees a
        permit for (:attr:`wakes_permit_waiters`). Elsewhere (MySQL,
        psycopg2, a transaction pooler, SQLite in memory or off Linux)
        permit waiters poll like every other waiter.
        """
        if self._dialect is None:
            self._setup()
        return self._handover or self._bells is not None

    @property
    def wakes_permit_waiters(self) -> bool:
        """Whether a semaphore's waiters sleep until a release wakes them.

        True where permits are handed over (:attr:`hands_over`:
        PostgreSQL, a SQLite file on Linux), and on MariaDB, where a waiter
        waits in the database (``GET_LOCK`` with a timeout, on a lock its
        process holds) and the release that frees a permit for it cuts the
        wait short (``KILL QUERY ID``). Asks a MySQL server which it is, once.
        """
        if self._dialect is None:
            self._setup()
        if self.hands_over:
            return True
        return bool(self._rings) or (
            self._rings is None and self._call("check the server", self._wakes)
        )

    def _waits_notified(self, kind: Kind | None) -> bool:
        """Whether a wait for ``kind`` (None: exclusive) sleeps on LISTEN,
        or (a permit on MariaDB or SQLite) until a release wakes it."""
        if kind is not None and kind.mode == "permit":
            if self.hands_over or self._rings is not False:
                return True
        return self.listens

    @property
    def dialect(self) -> Dialect:
        """The SQL dialect of the lock database."""
        if self._dialect is None:
            self._setup()
        return self._dialect  # type: ignore[return-value]

    def close(self) -> None:
        """Close every thread's connection (they reconnect on next use)."""
        for conn in list(self._connections):
            conn.close()
        self._forget_connections()

    # -- the algorithm, one attempt at a time -----------------------------

    def _digest(self, name: str) -> str:
        return record_digest(self.key_prefix, name)

    @staticmethod
    def _identity() -> tuple[str, int, str]:
        host, pid, thread = holder_identity()
        return host[:255], pid, thread[:255]

    def _attempt(
        self,
        cursor: Any,
        name: str,
        digest: str,
        token: str,
        ttl: float,
        identity: tuple[str, int, str],
        kind: Kind | None = None,
    ) -> tuple[int | None, float]:
        """Try once. Return ``(fence, 0)`` or ``(None, seconds worth waiting)``.

        ``kind`` is None for an exclusive lease.
        """
        dialect = self._dialect
        run = self._statement
        if dialect.looks_first and (kind is None or kind.mode == "shared"):
            # Leave the file's write lock alone while an exclusive lease lives.
            run(cursor, "probe_for", (token, digest))
            rows = cursor.fetchall()
            if rows and not rows[0][0]:
                if kind is None:
                    return self._busy(cursor, digest, token, identity, rows[0])
                if not rows[0][2]:  # held exclusively: readers wait it out
                    return None, max(0.0, float(rows[0][1] or 0.0))
        if kind is not None:
            return self._attempt_share(cursor, name, digest, token, ttl, identity, kind)
        host, pid, thread = identity
        ttl_p = dialect.ttl_param(ttl)
        run(cursor, "acquire", (token, host, pid, thread, ttl_p, digest, token))
        if dialect.returning:
            # fetchall, not fetchone: SQLite commits when the statement ends.
            rows = cursor.fetchall()
            if rows:
                if self._queued and token in self._queued:
                    self._leave_queue(cursor, digest, token)
                return int(rows[0][0]), 0.0
        elif cursor.rowcount:
            fence = int(cursor.lastrowid)
            if self._queued and token in self._queued:
                self._leave_queue(cursor, digest, token)
            return fence, 0.0
        run(cursor, "probe", (digest,))
        rows = cursor.fetchall()
        if not rows:
            fence = self._transaction(
                cursor,
                lambda cur: self._create(cur, name, digest, token, ttl_p, identity),
            )
            return fence, 0.0
        if rows[0][0]:
            return None, 0.0  # released between the two statements: go again
        return self._busy(cursor, digest, token, identity, rows[0])

    def _busy(
        self,
        cursor: Any,
        digest: str,
        token: str,
        identity: tuple[str, int, str],
        probed: tuple,
    ) -> tuple[None, float]:
        """An exclusive attempt found ``digest`` held (``probed``: the row as
        the ``probe`` statement reads it): return the wait worth waiting."""
        _free, remaining, shared = probed
        if shared:
            # Queue up: new shared requests now wait behind this one.
            self._queue_writer(cursor, digest, token, identity)
        return None, max(0.0, float(remaining or 0.0))

    def _floor(self, cursor: Any) -> int:
        """Return the fence a name's new row starts from, holding the floor.

        Inside the transaction that creates the row: the shared lock on the
        floor row keeps clear_stale() from deleting rows (and raising the
        floor) meanwhile, so a re-created row starts above every fence its
        name ever had.
        """
        self._statement(cursor, "ensure_floor", ())
        self._statement(cursor, "floor_shared", ())
        return int(cursor.fetchall()[0][0])

    def _create(
        self,
        cursor: Any,
        name: str,
        digest: str,
        token: str,
        ttl_p: Any,
        identity: tuple[str, int, str],
    ) -> int | None:
        floor = self._floor(cursor)
        host, pid, thread = identity
        params = (
            digest,
            self.key_prefix,
            encode_name(name),
            token,
            floor + 1,
            host,
            pid,
            thread,
            ttl_p,
        )
        if self.dialect.vendor == "mysql":
            try:
                self._statement(cursor, "create", params)
            except self._integrity_error:
                return None  # another creator won; the caller polls
        else:
            self._statement(cursor, "create", params)
            if cursor.rowcount != 1:
                return None
        return floor + 1

    def _extend_once(self, cursor: Any, digest: str, token: str, ttl: float) -> bool:
        self._statement(cursor, "extend", (self._dialect.ttl_param(ttl), digest, token))
        return cursor.rowcount == 1

    def _release_once(self, cursor: Any, digest: str, token: str) -> bool:
        run = self._statement
        if self.wait_notify:
            run(cursor, "release_notify", (digest, token, _channel(digest)))
            released = cursor.fetchall()[0][0] == 1
        else:
            run(cursor, "release", (digest, token))
            released = cursor.rowcount == 1
        if released:
            return True
        # Expired (not yet taken over): clear it anyway, but report the loss.
        run(cursor, "drop", (digest, token))
        return False

    def _is_held_once(self, cursor: Any, digest: str, token: str) -> bool:
        self._statement(cursor, "is_held", (digest, token))
        return bool(cursor.fetchall())

    def _drop_once(self, cursor: Any, digest: str, token: str) -> bool:
        self._statement(cursor, "drop", (digest, token))
        dropped = cursor.rowcount == 1
        if dropped and self.wait_notify:
            self._statement(cursor, "notify", (_channel(digest),))
            cursor.fetchall()
        return dropped

    # -- the contract -----------------------------------------------------

    def acquire(
        self, name: str, ttl: float, timeout: float | None, kind: Kind = EXCLUSIVE
    ) -> Lease | None:
        identity = self._identity()
        if kind is not EXCLUSIVE and not kind.exclusive:
            return self._acquire_kind(name, ttl, timeout, identity, kind)
        if self.listens:
            return self._acquire_notified(name, ttl, timeout, identity)
        return self._run(self._acquire_steps(name, ttl, timeout, identity))

    def _acquire_kind(
        self,
        name: str,
        ttl: float,
        timeout: float | None,
        identity: tuple[str, int, str],
        kind: Kind,
    ) -> Lease | None:
        share = self._share_kind(kind)
        if self._waits_notified(share):
            return self._acquire_notified(name, ttl, timeout, identity, None, share)
        return self._run(self._acquire_steps(name, ttl, timeout, identity, share))

    async def aacquire(
        self, name: str, ttl: float, timeout: float | None, kind: Kind = EXCLUSIVE
    ) -> Lease | None:
        """Poll from the event loop; each attempt runs in a worker thread.

        With ``WAIT = "notify"``, and for a permit whose waiters a release
        wakes (:attr:`wakes_permit_waiters`), the whole wait runs in one
        thread of a pool for waits (at most ``handoff.MAX_WAITS`` at once
        per process), whose connection waits for the release; the event
        loop's default executor stays free for releases. Cancelling the task does
        not stop a statement in flight: whatever it obtains afterwards is
        released as soon as the thread has it, and a notify wait ends at its
        next wake-up.
        """
        identity = self._identity()  # the task's identity, not the worker's
        share = None if kind is EXCLUSIVE or kind.exclusive else self._share_kind(kind)
        if self._waits_notified(share):

            def undo(lease: Lease | None) -> None:
                if lease is not None:
                    self._give_back(self._lease_digest(lease), lease.token)

            handoff = Handoff(undo)
            return await handoff.await_wait(
                self._acquire_notified, name, ttl, timeout, identity, handoff, share
            )
        return await self._arun(
            self._acquire_steps(name, ttl, timeout, identity, share)
        )

    def _lease_digest(self, lease: Lease) -> str:
        if isinstance(lease.state, str):
            return lease.state
        if lease.kind.exclusive:
            return self._digest(lease.name)
        return self._kind_digest(lease.name, lease.kind)

    def release(self, lease: Lease) -> bool:
        if lease.kind is not EXCLUSIVE and not lease.kind.exclusive:
            return self._release_share(lease)
        return self._call(
            "release", self._release_once, self._lease_digest(lease), lease.token
        )

    def extend(self, lease: Lease, ttl: float) -> bool:
        sent = time.monotonic()
        if lease.kind is not EXCLUSIVE and not lease.kind.exclusive:
            ok = self._extend_share(lease, ttl)
        else:
            ok = self._call(
                "extend", self._extend_once, self._lease_digest(lease), lease.token, ttl
            )
        if ok:
            lease.deadline = sent + ttl
        return ok

    def is_held(self, lease: Lease) -> bool:
        if lease.kind is not EXCLUSIVE and not lease.kind.exclusive:
            return self._share_is_held(lease)
        return self._call(
            "check", self._is_held_once, self._lease_digest(lease), lease.token
        )

    def _renew_once(self, cursor: Any, leases: list[Lease]) -> list[bool]:
        def renew_all(cur: Any) -> list[bool]:
            extend = self._extend_once
            return [
                extend(cur, self._lease_digest(lease), lease.token, lease.ttl)
                for lease in leases
            ]

        return self._transaction(cursor, renew_all)

    def renew(self, leases: Iterable[Lease]) -> list[bool | None]:
        """Renew every lease in one transaction: one commit, however many.

        Shared leases and permits are renewed one transaction each.
        """
        leases = list(leases)
        if any(not lease.kind.exclusive for lease in leases):
            return self._renew_mixed(leases)
        if len(leases) < 2:
            return super().renew(leases)
        sent = time.monotonic()
        try:
            results = self._call("renew", self._renew_once, leases)
        except LockBackendError:
            return [None] * len(leases)
        for lease, ok in zip(leases, results):
            if ok:
                lease.deadline = sent + lease.ttl
        return list(results)

    async def arelease(self, lease: Lease) -> bool:
        return await sync_to_async(self.release, thread_sensitive=False)(lease)

    async def aextend(self, lease: Lease, ttl: float) -> bool:
        return await sync_to_async(self.extend, thread_sensitive=False)(lease, ttl)

    async def ais_held(self, lease: Lease) -> bool:
        return await sync_to_async(self.is_held, thread_sensitive=False)(lease)

    async def arenew(self, leases: Iterable[Lease]) -> list[bool | None]:
        return await sync_to_async(self.renew, thread_sensitive=False)(list(leases))

    # -- listing and clearing ---------------------------------------------

    def _holder_rows(self, cursor: Any, prefix: str) -> list[tuple]:
        stored = encode_name(prefix)
        self._statement(cursor, "holders", (self.key_prefix, len(stored), stored))
        return list(cursor.fetchall())

    def holders(self, prefix: str = "") -> Iterator[Holder]:
        yield from self._exclusive_holders(prefix)
        yield from self._share_holders(prefix)

    def _exclusive_holders(self, prefix: str) -> Iterator[Holder]:
        rows = self._call(
            "list locks", self._holder_rows, prefix, deadline=LISTING_DEADLINE
        )
        when = datetime.fromtimestamp
        utc = timezone.utc
        for name, token, host, pid, thread, acquired, expires, fence in rows:
            name = decode_name(name)
            # Only a table left with a padding collation (MySQL before
            # 8.0.17, see migration 0002) can return more than the prefix.
            if not name.startswith(prefix):
                continue
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
            )

    def force_release(self, name: str, token: str, kind: Kind = EXCLUSIVE) -> bool:
        if not kind.exclusive:
            return self._force_release_share(name, token, kind)
        return self._call("force-release", self._drop_once, self._digest(name), token)

    def _drop_all(self, cursor: Any, pairs: list[tuple[str, str]]) -> list[bool]:
        drop = self._drop_once
        return self._transaction(
            cursor, lambda cur: [drop(cur, digest, token) for digest, token in pairs]
        )

    def force_release_many(self, items: Iterable[tuple]) -> list[bool]:
        """Force-release each ``(name, token)`` or ``(name, token, kind)``.

        Exclusive leases go a thousand per transaction; shared leases and
        permits one transaction each.
        """
        items = list(items)
        if any(len(item) > 2 and not item[2].exclusive for item in items):
            return [self.force_release(*item) for item in items]
        pairs = [(self._digest(item[0]), item[1]) for item in items]
        results: list[bool] = []
        for i in range(0, len(pairs), 1000):
            chunk = pairs[i : i + 1000]
            results.extend(self._call("force-release", self._drop_all, chunk))
        return results

    def _clear_stale_once(self, cursor: Any) -> int:
        sql = self._sql
        self._statement(cursor, "ensure_floor", ())

        def clear(cur: Any) -> int:
            # Lock the floor, then the rows to delete: creators wait on the
            # floor, acquirers on their row, so nothing changes under us.
            self._statement(cur, "floor_locked", ())
            self._statement(cur, "stale", (self.key_prefix,))
            rows = cur.fetchall()
            if not rows:
                return 0
            top = max(int(fence) for _, fence, _ in rows)
            self._statement(cur, "raise_floor", (top, top))
            ids = [row[0] for row in rows]
            mark = "?" if self.dialect.vendor == "sqlite" else "%s"
            for i in range(0, len(ids), DELETE_CHUNK):
                chunk = ids[i : i + DELETE_CHUNK]
                cur.execute(
                    sql["delete"] + "(" + ", ".join([mark] * len(chunk)) + ")",
                    chunk,
                )
            return sum(1 for _, _, expired in rows if expired)

        return self._transaction(cursor, clear) + self._clear_stale_shares(cursor)

    def clear_stale(self) -> int:
        """Delete free and expired rows; return how many expired leases went.

        The highest fence among them is kept in the floor row first, so the
        fencing tokens of a name never go back when its row is re-created.
        Expired shared leases, permits and waiters' places go too.
        """
        return self._call(
            "clear stale locks", self._clear_stale_once, deadline=LISTING_DEADLINE
        )

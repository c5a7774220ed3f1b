"""How the backend waits for a lock: polling, or LISTEN/NOTIFY on PostgreSQL.

The polling loop is written once, as a generator of steps (an attempt, a
sleep, a withdrawal) that the shared driver of :mod:`..steps` runs, in this
thread or on the event loop, so ``acquire`` and ``aacquire`` cannot drift
apart. Asyncio attempts run in worker threads; one whose task is cancelled
gives back what it obtains (:class:`Handoff`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import secrets
import time
from collections.abc import Callable, Generator
from functools import cached_property
from typing import Any

from ...exceptions import LockBackendError
from ..base import Lease
from ..handoff import Handoff
from ..indoubt import InDoubt
from ..kinds import EXCLUSIVE, Kind
from .bells import Bells
from .deadlines import STATEMENT_DEADLINE

__all__ = ["WaitingMixin"]

release_log = logging.getLogger("django_distlock.release")

#: First and longest sleep between two polls of a busy lock, seconds.
MIN_BACKOFF = 0.001
#: Longest wait for a notification before trying again anyway, seconds: it
#: bounds the delay after a release by a process that does not notify.
NOTIFY_SAFETY_WAIT = 1.0
#: Seconds the cancel of an acquisition that its deadline cut is tried for,
#: while the server process that had it lives on: a server stopped longer
#: than that, then resumed, would grant a lease that nobody holds.
SESSION_WATCH = 3600.0
#: MariaDB's error of a statement cut short by KILL QUERY.
ER_QUERY_INTERRUPTED = 1317
#: The polling loop as a generator of ``(kind, argument)`` steps, carried out
#: by :meth:`WaitingMixin._execute` or :meth:`WaitingMixin._aexecute`.
Steps = Generator[tuple[str, Any], Any, Any]


def _channel(key: str) -> str:
    """Return the LISTEN/NOTIFY channel of a lock's digest or a waiter's token.

    Hex: a safe identifier. A digest has 64 digits and a token 32, so the
    two never share a channel (migration 0004 names a waiter's the same way).
    """
    return "distlock_" + key[:40]


class WaitingMixin:
    """The waiting half of :class:`.backend.DatabaseLockBackend`.

    It runs the backend's single attempts (``_attempt``, ``_drop_any_once``)
    through its connections (``_call``) until the lock is acquired or the
    wait times out.
    """

    alias: str
    max_backoff: float
    wait_notify: bool
    _handover: bool
    _rings: bool | None
    _bells: Bells | None
    _local: Any
    _call: Callable[..., Any]
    _run: Callable[..., Any]
    _gate: Callable[[], str]
    _gate_lost: Callable[[], None]
    _attempt: Callable[..., tuple[int | None, float]]
    _digest: Callable[[str], str]
    _drop_any_once: Callable[..., bool]
    _withdraw_once: Callable[..., None]
    _kind_digest: Callable[[str, Kind], str]
    _queued: set[str]
    _in_doubt_errors: tuple[type[Exception], ...]

    # -- permit waiters woken by the release (MariaDB, SQLite) -------------

    def _wakes(self, cursor: Any) -> bool:
        """Whether a permit's release wakes the waiters it frees room for.

        On MariaDB: a waiter waits in one statement (:meth:`_doze`), which
        the release cuts short (:meth:`_ring`). On SQLite (Linux): a waiter
        waits on its thread's bell, which the release rings (:mod:`.bells`).
        """
        if self._rings is None:
            cursor.execute("SELECT VERSION()")
            self._rings = "mariadb" in str(cursor.fetchall()[0][0]).lower()
        return self._rings

    def _bell(self, cursor: Any) -> str:
        """Return the name of this connection's bell, which it holds.

        A user lock (``GET_LOCK``), held as long as the connection lives: a
        waiter's place names it, and a release finds the waiter's session by
        it (``IS_USED_LOCK``), or learns that the waiter has gone. On SQLite,
        the thread's datagram socket.
        """
        if self._bells is not None:
            return self._bells.own()
        _raw, held, own = self._listen_state(cursor)
        if own not in held:
            cursor.execute("SELECT GET_LOCK(%s, 0)", [own])
            cursor.fetchall()
            held.add(own)
        return own

    def _doze(
        self, cursor: Any, digest: str, token: str, limit: int, wait: float
    ) -> None:
        """Wait up to ``wait`` seconds, unless a permit is free for ``token``.

        The wait is on this process's gate, which a release that frees a
        permit for this waiter interrupts.
        """
        if not self._listen_state(cursor)[1]:
            return  # reconnected since the attempt: its place names no bell
        gate = self._gate()
        params = (digest, digest, digest, token, limit, gate, round(wait, 3))
        try:
            self._statement(cursor, "permit_doze", params)
            got = cursor.fetchall()[0][1]
        except Exception as e:
            if not (e.args and e.args[0] == ER_QUERY_INTERRUPTED):
                raise
            return
        if got == 1:  # the gate was free: its connection has gone
            cursor.execute("SELECT RELEASE_LOCK(%s)", [gate])
            cursor.fetchall()
            self._gate_lost()

    def _ring(self, cursor: Any, digest: str) -> None:
        """Wake the permit waiters of ``digest`` that have room now (MariaDB).

        Best effort, after the release committed: a waiter not woken wakes
        at the end of its sleep, when its permit's holders could expire.
        """
        try:
            self._statement(cursor, "permit_wake", (digest, digest, digest))
            for (query,) in cursor.fetchall():
                try:
                    cursor.execute("KILL QUERY ID %s", [int(query)])
                except Exception:  # noqa: BLE001 - it has just ended
                    pass
        except Exception:  # noqa: BLE001 - the release stands either way
            release_log.debug("Could not wake the permit's waiters", exc_info=True)

    # -- waiting for a notification (PostgreSQL, WAIT = "notify") ---------

    def _listen_state(self, cursor: Any) -> tuple[Any, set[str], str]:
        # This thread's *current* connection, the channels it listens to and
        # its own channel, where releases hand its permit waiters their
        # permits (in the set once the connection holds the channel's
        # advisory lock, the functions listening on it while the connection
        # waits; on MariaDB: its bell, held once it is in the set); a
        # reconnection starts again from nothing.
        raw = cursor.connection
        state = getattr(self._local, "listen", None)
        if state is None or state[0] is not raw:
            own = "distlock_wait_" + secrets.token_hex(8)
            state = self._local.listen = (raw, set(), own)
        return state

    def _listening(self, cursor: Any) -> set[str]:
        return self._listen_state(cursor)[1]

    def _handover_channel(self, cursor: Any) -> str | None:
        """Return the channel this connection takes handed-over permits on.

        None until the connection holds the channel's advisory lock: a
        release would otherwise take the waiter for gone (migration 0008).
        """
        if not self._handover:
            return None
        _raw, listening, own = self._listen_state(cursor)
        return own if own in listening else None

    def _listen_own_and_attempt(self, cursor: Any, *args: Any) -> Any:
        _raw, listening, own = self._listen_state(cursor)
        if own not in listening:
            # Once per connection: the channel is the connection's, not one
            # acquisition's. The advisory lock on its name lives as long as
            # the connection: a release that finds it free passes this
            # connection's waiters over (migration 0008). The connection
            # listens on it only while it waits: the acquisition function
            # LISTENs as it queues the waiter and UNLISTENs as it grants,
            # and the release function UNLISTENs (migration 0009).
            cursor.execute(
                "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", [own]
            )
            cursor.fetchall()
            listening.add(own)
        return self._attempt(cursor, *args)

    def _wait_handed(self, cursor: Any, token: str, timeout: float) -> int | None:
        """Wait for a release to hand ``token`` a permit; return its fence.

        Notifications for earlier waiters of this connection (handed a
        permit as they gave up, which their withdrawal gave back) are
        passed over.
        """
        _raw, listening, own = self._listen_state(cursor)
        if own not in listening:
            return None  # reconnected meanwhile: attempt (and LISTEN) again now
        mine = token + " "
        for note in cursor.connection.notifies(timeout=timeout):
            if note.channel == own and note.payload.startswith(mine):
                return int(note.payload[len(mine) :])
        return None

    @staticmethod
    def _wait_rung(bells: Bells, token: str, timeout: float) -> int | None:
        """Wait on this thread's bell for a release to hand ``token`` a
        permit (SQLite); return its fence, or None to attempt again.

        A datagram for an earlier waiter of this thread (handed a permit as
        it gave up, which its withdrawal gave back) is passed over; an empty
        one (a release by an earlier version) only wakes.
        """
        deadline = time.monotonic() + timeout
        mine = f"{token} ".encode()
        while (left := deadline - time.monotonic()) > 0:
            message = bells.wait(left)
            if not message:
                return None
            if message.startswith(mine):
                return int(message[len(mine) :])
        return None

    def _listen_and_attempt(
        self, cursor: Any, channels: tuple[str, ...], *args: Any
    ) -> Any:
        listening = self._listening(cursor)
        new = [channel for channel in channels if channel not in listening]
        if new:
            # LISTEN before the attempt: a release committed after the
            # attempt is then sure to be delivered (no lost wakeup). One
            # round trip for all channels (no parameters: one simple query).
            cursor.execute("; ".join(f"LISTEN {channel}" for channel in new))
            listening.update(new)
        return self._attempt(cursor, *args)

    def _wait_notified(
        self, cursor: Any, channels: tuple[str, ...], timeout: float
    ) -> None:
        if not self._listening(cursor).issuperset(channels):
            return  # reconnected meanwhile: attempt (and LISTEN) again now
        for _ in cursor.connection.notifies(timeout=timeout, stop_after=1):
            break

    def _unlisten(self, cursor: Any, channels: tuple[str, ...]) -> None:
        listening = self._listening(cursor)
        gone = [channel for channel in channels if channel in listening]
        if gone:
            listening.difference_update(gone)
            cursor.execute("; ".join(f"UNLISTEN {channel}" for channel in gone))

    def _acquire_notified(
        self,
        name: str,
        ttl: float,
        timeout: float | None,
        identity: tuple[str, int, str],
        handoff: Handoff | None = None,
        kind: Kind | None = None,
    ) -> Lease | None:
        if kind is not None and kind.mode == "permit":
            if self._handover or self._call("check the server", self._wakes):
                return self._acquire_permit(name, ttl, timeout, identity, handoff, kind)
            return self._run(self._acquire_steps(name, ttl, timeout, identity, kind))
        digest = self._digest(name) if kind is None else self._kind_digest(name, kind)
        token = secrets.token_hex(16)
        channels = (_channel(digest),)
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        args = (name, digest, token, ttl, identity)
        if kind is not None:
            args += (kind,)
        sent = time.monotonic()
        fence, hint = self._try_acquire(args, self._attempt)
        if fence is None and timeout != 0:
            try:
                while fence is None and not (handoff and handoff.abandoned):
                    sent = time.monotonic()
                    fence, hint = self._try_acquire(
                        args, self._listen_and_attempt, channels
                    )
                    left = deadline - time.monotonic()
                    if fence is not None or left <= 0:
                        break
                    if hint:
                        wait = min(hint + 0.001, left, NOTIFY_SAFETY_WAIT)
                        self._call(
                            "wait",
                            self._wait_notified,
                            channels,
                            wait,
                            deadline=STATEMENT_DEADLINE + wait,
                        )
            finally:
                try:
                    self._call("stop listening", self._unlisten, channels)
                except LockBackendError:
                    pass
        return self._outcome(name, digest, token, fence, ttl, sent, kind)

    def _acquire_permit(
        self,
        name: str,
        ttl: float,
        timeout: float | None,
        identity: tuple[str, int, str],
        handoff: Handoff | None,
        kind: Kind,
    ) -> Lease | None:
        """Wait for a permit, which a release hands over or wakes us for.

        PostgreSQL (:attr:`_handover`, migration 0006): the waiter's place
        in the queue names its connection's channel; a release that frees a
        permit grants it to the first waiter in line and sends it the
        fencing token there, so the waiter has it without another attempt.
        SQLite (Linux): the same, the place naming the thread's bell
        (:mod:`.bells`), where the release sends the fencing token.
        MariaDB: the waiter waits in the database until a release that frees
        a permit for it interrupts the wait (:meth:`_doze`, :meth:`_ring`),
        and then takes the permit. An attempt after each wait that ends
        without one (a holder's lease ran out, a wake-up was lost) finds a
        permit handed over meanwhile, or takes a free one.
        """
        digest = self._kind_digest(name, kind)
        token = secrets.token_hex(16)
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        args = (name, digest, token, ttl, identity, kind)
        handed = self._handover
        attempt = self._listen_own_and_attempt if handed else self._attempt
        if timeout == 0:
            attempt = self._attempt
        bells = self._bells
        fence: int | None = None
        while not (handoff and handoff.abandoned):
            sent = time.monotonic()
            if bells is not None:
                bells.drain()  # what rang before this attempt, it sees
            fence, hint = self._try_acquire(args, attempt)
            left = deadline - time.monotonic()
            if fence is not None or timeout == 0 or left <= 0:
                break
            wait = min(hint + 0.001, left, NOTIFY_SAFETY_WAIT)
            if handed:
                fence = self._call(
                    "wait",
                    self._wait_handed,
                    token,
                    wait,
                    deadline=STATEMENT_DEADLINE + wait,
                )
            elif bells is not None:
                fence = self._wait_rung(bells, token, wait)
            else:
                self._call("wait", self._doze, digest, token, kind.limit, wait)
            if fence is not None:
                self._queued.discard(token)
                break
        return self._outcome(name, digest, token, fence, ttl, sent, kind)

    def _lease(
        self,
        name: str,
        digest: str,
        token: str,
        fence: int,
        ttl: float,
        sent: float,
        kind: Kind | None,
    ) -> Lease:
        """The lease of the attempt sent at ``sent`` that obtained ``fence``."""
        return Lease(
            self.alias,
            name,
            token,
            fence,
            ttl,
            sent + ttl,
            state=digest,
            kind=EXCLUSIVE if kind is None else kind,
        )

    def _outcome(
        self,
        name: str,
        digest: str,
        token: str,
        fence: int | None,
        ttl: float,
        sent: float,
        kind: Kind | None,
    ) -> Lease | None:
        """The lease of a wait that obtained ``fence``; None for one that gave
        up, once its place in the queue (if it had one) is taken back."""
        if fence is None:
            if token in self._queued:
                self._withdraw(digest, token)
            return None
        return self._lease(name, digest, token, fence, ttl, sent, kind)

    # -- polling, written once for acquire() and aacquire() ---------------

    def _acquire_steps(
        self,
        name: str,
        ttl: float,
        timeout: float | None,
        identity: tuple[str, int, str],
        kind: Kind | None = None,
    ) -> Steps:
        """Poll for ``name`` until acquired or ``timeout``; return the lease.

        Yield ``("attempt", args)``, to be answered with what
        ``_attempt(cursor, *args)`` returns, ``("sleep", seconds)``, or
        ``("withdraw", (digest, token))`` to take a waiter's place in the
        queue back; the executors :meth:`_run` and :meth:`_arun` carry them
        out. ``kind`` is None for an exclusive lease.
        """
        digest = self._digest(name) if kind is None else self._kind_digest(name, kind)
        token = secrets.token_hex(16)
        args = (name, digest, token, ttl, identity)
        if kind is not None:
            args += (kind,)
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        delay = MIN_BACKOFF
        quick = 0
        while True:
            sent = time.monotonic()
            fence, hint = yield ("attempt", args)
            if fence is not None:
                return self._lease(name, digest, token, fence, ttl, sent, kind)
            if not hint and quick < 3:
                quick += 1  # the row was free or just created: go again now
                continue
            left = deadline - time.monotonic()
            if timeout == 0 or left <= 0:
                if token in self._queued:
                    yield ("withdraw", (digest, token))
                return None
            # Jittered exponential backoff, but wake when the lease can expire.
            wait = min(random.uniform(delay / 2, delay), hint + 0.001, left)
            yield ("sleep", max(0.0, wait))
            delay = min(delay * 2, self.max_backoff)

    def _execute(self, step: tuple[str, Any]) -> Any:
        """Carry out one step of :meth:`_acquire_steps` in this thread."""
        kind, arg = step
        if kind == "attempt":
            return self._try_acquire(arg, self._attempt)
        if kind == "withdraw":
            return self._withdraw(*arg)
        time.sleep(arg)
        return None

    async def _aexecute(self, step: tuple[str, Any]) -> Any:
        """Carry out one step on the event loop, attempts in worker threads.

        An attempt whose task is cancelled while it runs releases what it
        obtains (see :class:`Handoff`).
        """
        kind, arg = step
        if kind == "attempt":
            return await self._aattempt(*arg)
        if kind == "withdraw":
            return await asyncio.to_thread(self._withdraw, *arg)
        await asyncio.sleep(arg)
        return None

    async def _aattempt(
        self, name: str, digest: str, token: str, *args: Any
    ) -> tuple[int | None, float]:
        def undo(result: tuple[int | None, float]) -> None:
            if result[0] is not None:
                self._give_back(digest, token)

        return await Handoff(undo).arun(
            self._try_acquire, (name, digest, token, *args), self._attempt
        )

    # -- acquisitions whose outcome is unknown ----------------------------

    def _try_acquire(
        self, args: tuple, attempt: Callable[..., Any], *before: Any
    ) -> tuple[int | None, float]:
        """Run one ``attempt(cursor, *before, *args)``.

        If the connection failed under it, the server may still have granted
        the lock: the request went out and the reply (a COMMIT's included)
        never came back. Nobody would hold that grant, so it is cancelled in
        the background with the attempt's token (which no other holder has).
        """
        try:
            return self._call("acquire", attempt, *before, *args)
        except LockBackendError as e:
            if isinstance(e.__cause__, self._in_doubt_errors):
                _name, digest, token, ttl = args[:4]
                # The server process that still has the call, if its
                # deadline cut it.
                session = self._local.cut_session
                self._cancel_in_doubt(digest, token, ttl, session)
            raise

    @cached_property
    def in_doubt(self) -> InDoubt:
        """Return the canceller of this backend's in-doubt acquisitions."""
        return InDoubt(f"database-{self.alias}", self._cancel_pending)

    def _cancel_in_doubt(
        self, digest: str, token: str, ttl: float, session: int | None = None
    ) -> None:
        """Drop the grant of ``token``, if there is one, in the background.

        The backend's canceller thread tries it again until the database
        answers, or until the grant would have expired anyway. A call that
        its deadline cut is still in server process ``session``'s hands,
        which may run it when it goes on (a stopped server, resumed), after
        any cancel: that cancel is tried again until the process has gone,
        for up to :data:`SESSION_WATCH` seconds.
        """
        lasts = ttl if session is None else SESSION_WATCH
        self.in_doubt.add((digest, token, session), lasts)

    def _cancel_pending(self, items: list[tuple[str, str, int | None]]) -> list[bool]:
        done = []
        for digest, token, session in items:
            try:
                gone = session is None or not self._call(
                    "cancel", self._session_alive, session
                )
                if self._call("cancel", self._drop_any_once, digest, token):
                    release_log.info(
                        "Cancelled an acquisition whose reply was lost "
                        "(database lock backend %r)",
                        self.alias,
                    )
            except LockBackendError:
                done.append(False)
            else:
                done.append(gone)
        return done

    @staticmethod
    def _session_alive(cursor: Any, pid: int) -> bool:
        cursor.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid])
        return bool(cursor.fetchall())

    def _give_back(self, digest: str, token: str) -> None:
        """Release a lease that no handle knows about (its task was cancelled)."""
        try:
            self._call("release", self._drop_any_once, digest, token)
        except LockBackendError:
            release_log.warning(
                "A cancelled acquisition could not give its lease back; it "
                "expires with its TTL.",
                exc_info=True,
            )

    def _withdraw(self, digest: str, token: str) -> None:
        """Take back the place in a queue of a waiter that gave up.

        A place left behind would expire on its own within seconds.
        """
        self._queued.discard(token)
        try:
            self._call("withdraw", self._withdraw_once, digest, token, True)
        except LockBackendError:
            pass

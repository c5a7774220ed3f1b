"""Reentrant Redis locks: the plain backend's lease, with an owner and a count.

The owner of a lock is the current thread of the current process or, in
asyncio code, the current task (as with :class:`threading.RLock`). An owner
may take a lock it holds again without waiting and must release it as many
times; every other owner is excluded until the count returns to zero.

The lease is the plain backend's Redis hash (fields ``t f n h p th a``, so
listing works unchanged) plus ``o`` (``"<owner> <token>"``) and ``c`` (the
nesting count). Each operation is one Lua script. Nested acquisitions by one
owner share the outermost acquisition's token and fencing token; releasing
the last level releases the lock and hands it to the first queued waiter,
exactly as the plain backend does, so waiting needs no polling.

In this process, the :class:`ReentrantLease` objects of one owner's nested
acquisitions share one :class:`_Hold`: its deadline, and its renewal, which
therefore costs one round trip per owner and period, whatever the depth.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import secrets
import threading
import time
import weakref
from collections.abc import Generator, Iterable
from dataclasses import dataclass, field
from typing import Any

from ...exceptions import LockNotHeld
from ..base import Lease, holder_identity, new_token, running_task
from .keys import CANCEL, R_ACQUIRE, R_ADOPT, R_EXTEND, R_RELEASE
from .keys import ms as _ms
from .plain import WAITER_GRACE_MS, Command, RedisLockBackend
from .replicas import granted_by, popped_by

__all__ = ["ReentrantLease", "ReentrantRedisLockBackend", "current_owner"]

#: Holds remembered per backend before dropped ones are swept out.
MAX_HOLDS = 1024


def _retrieve(task: asyncio.Task) -> None:
    # A shielded release whose caller was cancelled: its outcome (an error
    # too) is nobody's to read; read it so asyncio does not report it.
    if not task.cancelled():
        task.exception()


# -- owner identity ----------------------------------------------------------

# A random id per process (new in a forked child) plus a per-process counter
# per thread or task: unique across hosts, and never reused by a later thread
# that happens to get a dead thread's ident.
_process_id = secrets.token_hex(8)
_counter = itertools.count(1)
_thread_owner = threading.local()
_task_owners: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _new_process_id() -> None:
    global _process_id, _task_owners
    _process_id = secrets.token_hex(8)
    _task_owners = weakref.WeakKeyDictionary()


os.register_at_fork(after_in_child=_new_process_id)


def current_owner() -> str:
    """Return the id of the caller as a lock owner.

    That is the running asyncio task if there is one, else the current
    thread, prefixed with this process's random id.
    """
    task = running_task()
    if task is not None:
        owner = _task_owners.get(task)
        if owner is None:
            owner = _task_owners[task] = f"{_process_id}:a{next(_counter)}"
        return owner
    mine = getattr(_thread_owner, "owner", None)
    if mine is None or mine[0] is not _process_id:
        mine = _thread_owner.owner = (_process_id, f"{_process_id}:t{next(_counter)}")
    return mine[1]


# -- leases ------------------------------------------------------------------


class _Hold:
    """One owner's hold on one lock in this process: what its levels share."""

    __slots__ = ("__weakref__", "deadline", "gone", "name", "owner", "refs", "token")

    def __init__(self, name: str, token: str, owner: str, deadline: float):
        self.name = name
        self.token = token
        self.owner = owner
        self.deadline = deadline
        self.gone = False
        # Copy-on-write list of weak references: the watchdog thread reads it
        # while the owner adds to it.
        self.refs: list[weakref.ref] = []

    def add(self, lease: ReentrantLease) -> None:
        self.refs = [r for r in self.refs if r() is not None] + [weakref.ref(lease)]

    def leases(self) -> list[ReentrantLease]:
        """Return the levels still held through this process."""
        return [
            lease
            for lease in (r() for r in self.refs)
            if lease is not None and not lease.released
        ]

    def set_deadline(self, deadline: float) -> None:
        self.deadline = deadline
        for lease in self.leases():
            lease.deadline = deadline


@dataclass(eq=False)
class ReentrantLease(Lease):
    """One nesting level of a reentrant lock.

    The levels of one owner have the same ``token`` and ``fencing_token``
    and share one deadline.
    """

    owner: str = ""
    hold: _Hold | None = field(default=None, repr=False)
    released: bool = False

    def check_owner_process(self) -> None:
        """Raise LockNotHeld unless called by the owner: process and thread/task."""
        super().check_owner_process()
        if current_owner() != self.owner:
            raise LockNotHeld(
                f"Lock {self.name!r} is held by another thread or task; only "
                "its owner can release or extend it.",
                name=self.name,
            )


# -- the backend -------------------------------------------------------------


class ReentrantRedisLockBackend(RedisLockBackend):
    """Reentrant locks on one Redis server.

    The owner (current thread, or current asyncio task) may acquire a lock it
    holds again without waiting and must release it as many times. Nested
    acquisitions keep the fencing token and refresh the lease to at least
    their ``ttl``; auto-renewal renews each owner's lease once per period,
    whatever the depth. A :class:`~django_distlock.locking.Lock` handle
    handed to another thread is used by a different owner there: it waits
    like anyone else and cannot release the first thread's levels.

    Settings and OPTIONS are those of :class:`RedisLockBackend`. Aliases that
    share a server and ``KEY_PREFIX`` share lock names: a plain and a
    reentrant acquisition of one name exclude each other.
    """

    reentrant = True
    #: Shared and semaphore reentrancy are not offered: only the exclusive kind.
    kinds = frozenset({"exclusive"})

    def __init__(self, alias: str, params: dict[str, Any]):
        super().__init__(alias, params)
        # (name, token) -> the hold of this process's owner of that lease;
        # removed at the last release (a plain dict: this is the hot path).
        self._holds: dict[tuple[str, str], _Hold] = {}

    # -- the algorithm, as command generators -----------------------------

    def _lease(
        self, name: str, token: str, fence: Any, ttl: float, deadline: float, owner
    ) -> ReentrantLease:
        hold = self._holds.get((name, token))
        if hold is None or hold.owner != owner or hold.gone:
            if len(self._holds) >= MAX_HOLDS:
                self._sweep_holds()
            hold = self._holds[(name, token)] = _Hold(name, token, owner, deadline)
        lease = ReentrantLease(
            alias=self.alias,
            name=name,
            token=token,
            fencing_token=int(fence),
            ttl=ttl,
            deadline=deadline,
            owner=owner,
            hold=hold,
        )
        hold.add(lease)
        hold.set_deadline(deadline)
        return lease

    def _sweep_holds(self) -> None:
        # Forget holds whose levels were all dropped without a release (their
        # leases expire on the server by themselves).
        for key, hold in self._holds.copy().items():
            if hold.gone or not hold.leases():
                self._holds.pop(key, None)

    def _holds_live(self, name: str, token: str, owner: str) -> bool:
        """Return True if a level of ``owner``'s hold on ``name`` is still held."""
        hold = self._holds.get((name, token))
        return (
            hold is not None
            and not hold.gone
            and hold.owner == owner
            and bool(hold.leases())
        )

    def _forget(self, hold: _Hold) -> None:
        hold.gone = True
        if self._holds.get((hold.name, hold.token)) is hold:
            self._holds.pop((hold.name, hold.token), None)

    def _acquire_steps(
        self, name: str, ttl: float, timeout: float | None, token: str | None = None
    ) -> Generator[Command, Any, Lease | None]:
        keys = self.keys_for(name)
        token = token or new_token()
        owner = current_owner()
        host, pid, thread = holder_identity()
        ttl_ms = _ms(ttl)
        start = time.monotonic()
        deadline = math.inf if timeout is None else start + timeout
        blocking = timeout is None or timeout > 0
        slice_len = min(self.max_wait_slice, deadline - start)
        args = [token, ttl_ms, keys.stored_name, host, pid, thread]

        sent = start
        live_ms = _ms(slice_len) + WAITER_GRACE_MS if blocking else 0
        wake = keys.wake_prefix + token
        try:
            if self.wait_replicas:
                reply = yield from self._racquire(keys, token, [*args, live_ms, owner])
            else:
                reply = yield ("eval", R_ACQUIRE, keys.triple, [*args, live_ms, owner])
        except GeneratorExit:
            # The server did not answer: cancelled in the background.
            self._in_doubt(name, token, ttl)
            raise
        except BaseException:
            # Interrupted (a cancelled task...) after the request may have
            # reached the server: leave the queue, give back a lease taken,
            # so that no waiter is handed a lock whose caller is gone.
            try:
                yield from self._cancel_steps(keys, token)
            except GeneratorExit:
                self._in_doubt(name, token, ttl)
                raise
            raise
        if reply[0] == 2 and not self._holds_live(name, reply[2].decode(), owner):
            # Re-entered levels no handle of ours holds: left by a release
            # whose outcome was unknown (its reply was lost). Re-entering
            # them would keep that lease alive for ever and repeat its
            # fencing token; drop them all and take the lock afresh.
            yield (
                "eval",
                R_RELEASE,
                keys.triple,
                [reply[2].decode(), keys.wake_prefix, ""],
            )
            left = None if timeout is None else max(0.0, deadline - time.monotonic())
            return (yield from self._acquire_steps(name, ttl, left, token))
        if reply[0]:
            _, fence, holder, pttl = reply
            return self._lease(
                name, holder.decode(), fence, ttl, sent + int(pttl) / 1000, owner
            )
        try:
            got = yield from self._reentrant_wait_steps(
                keys, args, owner, wake, reply, sent, deadline, blocking
            )
        except GeneratorExit:
            # The server did not answer: cancelled in the background.
            self._in_doubt(name, token, ttl)
            raise
        except BaseException:
            # Interrupted (cancelled task, KeyboardInterrupt...) while queued:
            # leave the queue, and give back a lease handed over meanwhile.
            if blocking:
                try:
                    yield from self._cancel_steps(keys, token)
                except GeneratorExit:
                    self._in_doubt(name, token, ttl)
                    raise
            raise
        if got is None:
            return None
        holder, fence, deadline_at = got
        return self._lease(name, holder, fence, ttl, deadline_at, owner)

    def _racquire(self, keys, token: str, args: list) -> Generator[Command, Any, list]:
        """Run the reentrant acquire script (followed by WAIT with
        WAIT_REPLICAS: a fresh grant that too few replicas confirmed was given
        back, and the lock counts as busy)."""
        acquire = ("eval", R_ACQUIRE, keys.triple, args)
        if not self.wait_replicas:
            return (yield acquire)
        reply = yield from self._replicated(acquire, keys, token, granted_by)
        return [0, 0] if reply is None else reply

    def _give_back_command(self, keys, token: str) -> Command:
        # Every level of the lease: an in-doubt attempt's token is its own.
        return ("eval", R_RELEASE, keys.triple, [token, keys.wake_prefix, ""])

    def _reentrant_wait_steps(
        self, keys, args, owner, wake, reply, sent, deadline, blocking
    ) -> Generator[Command, Any, tuple[str, Any, float] | None]:
        """Wait for a busy lock; return (token, fence, deadline) or None."""
        token = args[0]
        while not reply[0]:
            now = time.monotonic()
            if now >= deadline or not blocking:
                if blocking:
                    # Withdraw; a handoff that came first is kept.
                    cancel = ("eval", CANCEL, (*keys.triple, wake), [token])
                    if self.wait_replicas:
                        reply = yield from self._replicated(
                            cancel, keys, token, granted_by
                        )
                        got, fence = reply or (0, 0)
                    else:
                        got, fence = yield cancel
                    if got:
                        yield ("eval", R_ADOPT, (keys.lease,), [token, owner])
                        return token, fence, sent + int(args[1]) / 1000
                return None
            # Sleep until woken by a handoff, or until the lease could have
            # expired (its holder may have died), or the slice ends.
            pttl = int(reply[1]) / 1000 if int(reply[1]) > 0 else 0.0
            wait = min(deadline - now, self.max_wait_slice, pttl + 0.002)
            if wait >= 0.001:
                blpop = ("blpop", wake, round(wait, 3))
                if self.wait_replicas:
                    popped = yield from self._replicated(blpop, keys, token, popped_by)
                else:
                    popped = yield blpop
                if popped is not None:
                    message = popped[1]
                    if not message.startswith(b"+"):
                        # Handed on by a plain release script: claim o and c.
                        yield ("eval", R_ADOPT, (keys.lease,), [token, owner])
                    return token, message, sent + int(args[1]) / 1000
            sent = time.monotonic()
            slice_len = min(self.max_wait_slice, deadline - sent)
            live_ms = _ms(max(slice_len, 0.001)) + WAITER_GRACE_MS
            reply = yield from self._racquire(keys, token, [*args, live_ms, owner])
        _, fence, holder, pttl = reply
        return holder.decode(), fence, sent + int(pttl) / 1000

    def _check_caller(self, lease: Lease) -> ReentrantLease:
        if not isinstance(lease, ReentrantLease):
            raise TypeError(f"{self!r} got a lease it did not make: {lease!r}")
        lease.check_owner_process()
        return lease

    def _release_steps(
        self, lease: Lease, checked: bool = False
    ) -> Generator[Command, Any, bool]:
        if not checked:
            lease = self._check_caller(lease)
        if lease.released:
            return False
        lease.released = True
        keys = self.keys_for(lease.name)
        # The owner's last level held in this process releases the lease
        # whole (owner ''): a level counted on the server beyond it is one
        # whose acquisition was interrupted after it got there, and no
        # handle could ever release it.
        owner = lease.owner if lease.hold.leases() else ""
        code = yield (
            "eval",
            R_RELEASE,
            keys.triple,
            [lease.token, keys.wake_prefix, owner],
        )
        if code != 3:
            self._forget(lease.hold)
        return code != 0

    async def arelease(self, lease: Lease) -> bool:
        """Async twin of :meth:`release`, run to its end even if cancelled.

        A release interrupted before it reached the server (redis-py may
        wait for its pool first) would leave the lease held for its ttl, and
        one that did reach it must not be sent twice (it counts a level
        down): so the release runs in a task of its own, shielded from the
        caller's cancellation.
        """
        lease = self._check_caller(lease)  # the owner is the calling task
        task = asyncio.ensure_future(self._arun(self._release_steps(lease, True)))
        task.add_done_callback(_retrieve)
        return await asyncio.shield(task)

    def _extend_steps(self, lease: Lease, ttl: float) -> Generator[Command, Any, bool]:
        lease = self._check_caller(lease)
        if lease.released or lease.hold.gone:
            return False
        sent = time.monotonic()
        left = yield (
            "eval",
            R_EXTEND,
            (self.keys_for(lease.name).lease,),
            [lease.token, _ms(ttl), 0],
        )
        if not left:
            self._forget(lease.hold)
            return False
        lease.hold.set_deadline(sent + ttl)
        return True

    def _is_held_steps(self, lease: Lease) -> Generator[Command, Any, bool]:
        if getattr(lease, "released", False):
            return False
        return (yield from super()._is_held_steps(lease))

    # -- renewal: once per owner, not per level ----------------------------

    def _plan_renewal(self, leases: list[Lease]):
        """Return (results so far, the holds that need a round trip)."""
        results: list[bool | None] = [None] * len(leases)
        now = time.monotonic()
        groups: dict[int, tuple[_Hold, list[int]]] = {}
        for i, lease in enumerate(leases):
            hold = getattr(lease, "hold", None)
            if hold is None or lease.released or hold.gone:
                results[i] = False
            else:
                groups.setdefault(id(hold), (hold, []))[1].append(i)
        due: list[tuple[_Hold, list[int], float]] = []
        for hold, indices in groups.values():
            if all(hold.deadline - leases[i].ttl * 2 / 3 > now for i in indices):
                # Another level of this hold was renewed meanwhile.
                for i in indices:
                    leases[i].deadline = hold.deadline
                    results[i] = True
                continue
            levels = hold.leases() or [leases[i] for i in indices]
            due.append((hold, indices, max(lease.ttl for lease in levels)))
        return results, due

    def _renewal_command(self, hold: _Hold, ttl: float) -> Command:
        return (
            "eval",
            R_EXTEND,
            (self.keys_for(hold.name).lease,),
            [hold.token, _ms(ttl), 1],
        )

    def _settle_renewal(self, due, replies, sent: float, results) -> list[bool | None]:
        for (hold, indices, _), reply in zip(due, replies):
            if isinstance(reply, Exception):
                continue
            if reply:
                hold.set_deadline(sent + int(reply) / 1000)
                ok = True
            else:
                self._forget(hold)
                ok = False
            for i in indices:
                results[i] = ok
        return results

    def renew(self, leases: Iterable[Lease]) -> list[bool | None]:
        """Renew the holds behind ``leases``: one pipelined round trip in all.

        Levels of one hold are renewed together, at the longest ttl among
        its levels; a level whose hold was renewed recently enough costs no
        round trip at all.
        """
        leases = list(leases)
        results, due = self._plan_renewal(leases)
        if not due:
            return results
        sent = time.monotonic()
        replies = self._pipeline(
            [self._renewal_command(hold, ttl) for hold, _, ttl in due]
        )
        return self._settle_renewal(due, replies, sent, results)

    async def arenew(self, leases: Iterable[Lease]) -> list[bool | None]:
        """Async twin of :meth:`renew`, on the event loop's own client."""
        leases = list(leases)
        results, due = self._plan_renewal(leases)
        if not due:
            return results
        sent = time.monotonic()
        replies = await self._apipeline(
            [self._renewal_command(hold, ttl) for hold, _, ttl in due]
        )
        return self._settle_renewal(due, replies, sent, results)

    # -- listing and clearing ----------------------------------------------

    def _force_release_command(self, name: str, token: str) -> tuple:
        # Every level of the lease, whoever its owner.
        keys = self.keys_for(name)
        return ("eval", R_RELEASE, keys.triple, [token, keys.wake_prefix, ""])

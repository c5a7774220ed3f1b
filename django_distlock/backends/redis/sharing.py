"""Shared locks and semaphore permits on the single-instance Redis backend.

A shared lock uses the exclusive lock's own keys plus two: while shared
holders hold it, the lease hash ``<KEY_PREFIX>:{<digest>}`` has ``t`` set to
:data:`MARK` (never a token, so the exclusive scripts see the lock busy and
queue behind it, unchanged and no slower), and the holders are the ZSET
``...:s`` (token -> expiry) with their metadata in ``...:m``. Shared waiters
queue in the lock's one waiter queue (their tokens start with ``~``): new
shared requests queue behind the first live exclusive waiter (writer
preference), whose queue record lapses within a wait slice and a second if it
dies.

A semaphore lives apart, under ``...{<digest>}:p`` (limit, name, last fence),
``:pz`` (permits: token -> expiry), ``:pm`` (their metadata), ``:pq``/``:pr``
(a FIFO waiter queue) and ``:pw:<token>`` (wake lists). Every key of one name
carries the ``{<digest>}`` hash tag: one slot of a Redis Cluster, so every
script runs atomically there too. Waiters are woken through their wake lists
as the exclusive ones are.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Awaitable, Generator
from functools import cached_property
from typing import Any

from asgiref.sync import markcoroutinefunction

from ...keys import encode_name
from ..base import EXCLUSIVE, Kind, Lease, holder_identity, new_token
from ..indoubt import InDoubt
from ..kinds import limit_mismatch
from ..scripts import LuaScript, load_script
from .keys import EXTEND, RELEASE, ms

__all__ = ["MARK", "RedisKinds", "SemaphoreKeys", "SharedKeys"]

_HERE = __name__.rpartition(".")[0]
_COMMON = load_script(_HERE, "kinds_common").source

release_log = logging.getLogger("django_distlock.release")

#: The lease hash's ``t`` while shared holders hold the lock.
MARK = "*shared"


def _with_common(name: str) -> LuaScript:
    source = _COMMON + "\n" + load_script(_HERE, name).source
    return LuaScript(name, source, hashlib.sha1(source.encode()).hexdigest())


SHARED_ACQUIRE = _with_common("kinds_shared_acquire")
SHARED_RELEASE = _with_common("kinds_shared_release")
PERMIT_ACQUIRE = _with_common("kinds_permit_acquire")
PERMIT_RELEASE = _with_common("kinds_permit_release")
HELD = _with_common("kinds_held")
LIST_KIND = _with_common("kinds_list")
PURGE = _with_common("kinds_purge")
LEAVE = load_script(_HERE, "kinds_leave")

#: How long after its expected next call a waiter's queue record stays valid.
WAITER_GRACE_MS = 1000


class SharedKeys:
    """The Redis keys of the shared holders of lock ``name`` (one slot)."""

    __slots__ = ("acquire", "five", "holders", "mark", "owner", "release", "wake")

    def __init__(self, lock_keys):
        self.owner = lock_keys.lease
        self.holders = self.owner + ":s"
        meta = self.owner + ":m"
        self.five = (self.owner, lock_keys.queue, lock_keys.records, self.holders, meta)
        self.wake = lock_keys.wake_prefix
        self.mark = MARK
        self.acquire = SHARED_ACQUIRE
        self.release = SHARED_RELEASE

    @property
    def held(self) -> tuple[str, str, str]:
        """Return the holders ZSET, owner hash and metadata keys."""
        return (self.holders, self.owner, self.five[4])


class SemaphoreKeys(SharedKeys):
    """The Redis keys of semaphore ``name``: apart from lock ``name``'s."""

    __slots__ = ()

    def __init__(self, lock_keys):
        self.owner = lock_keys.lease + ":p"
        self.holders = self.owner + "z"
        queue, records, meta = self.owner + "q", self.owner + "r", self.owner + "m"
        self.five = (self.owner, queue, records, self.holders, meta)
        self.wake = self.owner + "w:"
        self.mark = ""
        self.acquire = PERMIT_ACQUIRE
        self.release = PERMIT_RELEASE


def holder_keys(lock_keys, kind: Kind) -> SharedKeys:
    """Return the keys of the ``kind`` holders (shared or permit) of a name."""
    if kind.mode == "permit":
        return SemaphoreKeys(lock_keys)
    return SharedKeys(lock_keys)


class RedisKinds:
    """Shared leases and permits for :class:`~.plain.RedisLockBackend`.

    A mixin: the exclusive kind goes straight to the backend's own steps
    (one identity test more on its path); the others run the steps below.
    """

    kinds = frozenset({"exclusive", "shared", "permit"})

    def _kind_keys(self, name: str, kind: Kind) -> SharedKeys:
        return holder_keys(self.keys_for(name), kind)

    def _check_kind(self, kind: Kind) -> None:
        if kind.mode not in self.kinds:
            raise ValueError(
                f"{type(self).__name__} {self.alias!r} does not offer {kind} locks."
            )
        if kind.mode == "permit" and (type(kind.limit) is not int or kind.limit < 1):
            raise ValueError(
                f"A semaphore limit must be a positive int, not {kind.limit!r}."
            )

    # -- dispatch ---------------------------------------------------------

    def acquire(
        self, name: str, ttl: float, timeout: float | None, kind: Kind = EXCLUSIVE
    ) -> Lease | None:
        """Acquire ``name`` as ``kind``: see :meth:`.BaseLockBackend.acquire`."""
        if kind is EXCLUSIVE or kind.mode == "exclusive":
            return self._run(self._acquire_steps(name, ttl, timeout))
        self._check_kind(kind)
        return self._run(self._kind_acquire_steps(name, ttl, timeout, kind))

    @markcoroutinefunction
    def aacquire(
        self, name: str, ttl: float, timeout: float | None, kind: Kind = EXCLUSIVE
    ) -> Awaitable[Lease | None]:
        """Async twin of :meth:`acquire`."""
        if kind is EXCLUSIVE or kind.mode == "exclusive":
            return self._arun(self._acquire_steps(name, ttl, timeout))
        self._check_kind(kind)
        return self._arun(self._kind_acquire_steps(name, ttl, timeout, kind))

    def release(self, lease: Lease) -> bool:
        """Release ``lease`` (of its own kind); False if no longer held."""
        if lease.kind is EXCLUSIVE or lease.kind.exclusive:
            return self._run(self._release_steps(lease))
        return self._run(self._kind_release_steps(lease))

    @markcoroutinefunction
    def arelease(self, lease: Lease) -> Awaitable[bool]:
        """Async twin of :meth:`release`."""
        if lease.kind is EXCLUSIVE or lease.kind.exclusive:
            return self._arun(self._release_steps(lease))
        return self._arun(self._kind_release_steps(lease))

    def extend(self, lease: Lease, ttl: float) -> bool:
        """Make ``lease`` expire ``ttl`` seconds from now; False if not held."""
        if lease.kind is EXCLUSIVE or lease.kind.exclusive:
            return self._run(self._extend_steps(lease, ttl))
        return self._run(self._kind_extend_steps(lease, ttl))

    @markcoroutinefunction
    def aextend(self, lease: Lease, ttl: float) -> Awaitable[bool]:
        """Async twin of :meth:`extend`."""
        if lease.kind is EXCLUSIVE or lease.kind.exclusive:
            return self._arun(self._extend_steps(lease, ttl))
        return self._arun(self._kind_extend_steps(lease, ttl))

    def is_held(self, lease: Lease) -> bool:
        """Return True if ``lease`` still holds its lock, share or permit."""
        if lease.kind is EXCLUSIVE or lease.kind.exclusive:
            return self._run(self._is_held_steps(lease))
        return self._run(self._kind_is_held_steps(lease))

    @markcoroutinefunction
    def ais_held(self, lease: Lease) -> Awaitable[bool]:
        """Async twin of :meth:`is_held`."""
        if lease.kind is EXCLUSIVE or lease.kind.exclusive:
            return self._arun(self._is_held_steps(lease))
        return self._arun(self._kind_is_held_steps(lease))

    def _kind_renewal(self, lease: Lease) -> tuple:
        """Return the renewal command of a shared lease or a permit."""
        if lease.kind.exclusive:  # an equal Kind, not the EXCLUSIVE object
            return (
                "eval",
                EXTEND,
                (self.keys_for(lease.name).lease,),
                [lease.token, ms(lease.ttl)],
            )
        keys = self._kind_keys(lease.name, lease.kind)
        return ("eval", HELD, keys.held, [lease.token, ms(lease.ttl), keys.mark])

    # -- the steps --------------------------------------------------------

    def _kind_acquire_steps(
        self, name: str, ttl: float, timeout: float | None, kind: Kind
    ) -> Generator[tuple, Any, Lease | None]:
        keys = self._kind_keys(name, kind)
        shared = kind.mode == "shared"
        # The queue is shared with exclusive waiters: "~" marks shared ones.
        token = "~" + new_token() if shared else new_token()
        host, pid, thread = holder_identity()
        start = time.monotonic()
        deadline = math.inf if timeout is None else start + timeout
        blocking = timeout is None or timeout > 0
        slice_len = min(self.max_wait_slice, deadline - start)
        live_ms = ms(slice_len) + WAITER_GRACE_MS if blocking else 0
        args = [token, ms(ttl), encode_name(name), host, pid, thread, live_ms]
        # The last: whether the token may hold or wait already (a retry).
        args += [keys.wake, 0, kind.limit or 0, 0]
        wake = keys.wake + token
        sent = start
        try:
            code, value = yield ("eval", keys.acquire, keys.five, args)
            args[10] = 1
            while code == 0:
                now = time.monotonic()
                if now >= deadline or not blocking:
                    if blocking:  # leave the queue; keep what was granted
                        args[6], args[8] = 0, 1
                        code, value = yield ("eval", keys.acquire, keys.five, args)
                    break
                pttl = int(value) / 1000 if int(value) > 0 else 0.0
                wait = min(deadline - now, self.max_wait_slice, pttl + 0.002)
                if wait >= 0.001:
                    popped = yield ("blpop", wake, round(wait, 3))
                    if popped is not None:
                        message = popped[1]
                        if not shared or message[:1] == b"s":
                            code, value = 1, message.lstrip(b"s")
                            break
                        # An exclusive release handed this shared waiter the
                        # lease: the next call turns it into a shared one.
                sent = time.monotonic()
                slice_len = min(self.max_wait_slice, deadline - sent)
                args[6] = ms(max(slice_len, 0.001)) + WAITER_GRACE_MS
                code, value = yield ("eval", keys.acquire, keys.five, args)
        except GeneratorExit:
            # Closed by the executor: the server did not answer, but it may
            # have granted or queued the attempt all the same. Cancelled in
            # the background once it answers (no round trip here).
            self._kind_in_doubt(name, token, ttl, kind)
            raise
        except BaseException:
            # Interrupted after the request may have reached the server: leave
            # the queue and give back what was granted meanwhile.
            args[6], args[8], args[10] = 0, 1, 1
            try:
                got, _ = yield ("eval", keys.acquire, keys.five, args)
                if got == 1:
                    yield ("eval", keys.release, keys.five, [token, keys.wake])
            except GeneratorExit:
                self._kind_in_doubt(name, token, ttl, kind)
                raise
            raise
        if code == -1:
            raise limit_mismatch(name, int(value), kind.limit)
        if code != 1:
            return None
        return Lease(
            alias=self.alias,
            name=name,
            token=token,
            fencing_token=int(value),
            ttl=ttl,
            deadline=sent + ttl,
            kind=kind,
        )

    # -- acquisitions whose outcome is unknown ----------------------------

    @cached_property
    def kinds_in_doubt(self) -> InDoubt:
        """Return the canceller of in-doubt shared and permit acquisitions.

        Apart from the exclusive one (:attr:`in_doubt`), whose path stays
        as it is; a thread only runs while something is pending.
        """
        return InDoubt(f"redis-{self.alias}-kinds", self._cancel_kinds_in_doubt)

    def _kind_in_doubt(self, name: str, token: str, ttl: float, kind: Kind) -> None:
        # As the exclusive case: a grant lasts ttl, a queue record may be
        # handed a grant for one wait slice and its grace.
        lasts = ttl + self.max_wait_slice + WAITER_GRACE_MS / 1000
        self.kinds_in_doubt.add((name, token, kind.mode == "permit"), lasts)

    def _cancel_kinds_in_doubt(self, items: list[tuple[str, str, bool]]) -> list[bool]:
        """Cancel in-doubt shared and permit attempts in one pipelined round trip.

        Per attempt: leave the queue (:file:`kinds_leave.lua`), then the
        kind's release script with the attempt's token; for a shared one,
        also the exclusive release, as an exclusive release may have handed
        the lease itself to the shared waiter. Each release compares the
        token, so it never touches another holder's lease.
        """
        commands: list[tuple] = []
        spans: list[tuple[int, int]] = []
        for name, token, permit in items:
            lock_keys = self.keys_for(name)
            keys = SemaphoreKeys(lock_keys) if permit else SharedKeys(lock_keys)
            start = len(commands)
            queue, records = keys.five[1], keys.five[2]
            commands.append(
                ("eval", LEAVE, (queue, records, keys.wake + token), [token])
            )
            commands.append(("eval", keys.release, keys.five, [token, keys.wake]))
            if not permit:
                commands.append(
                    ("eval", RELEASE, lock_keys.triple, [token, lock_keys.wake_prefix])
                )
            spans.append((start, len(commands)))
        replies = self._pipeline(commands)
        done = []
        for (name, _token, permit), (start, end) in zip(items, spans):
            answered = replies[start:end]
            ok = not any(isinstance(r, Exception) for r in answered)
            if ok and any(answered):
                release_log.info(
                    "Cancelled a %s acquisition of %r whose reply was lost "
                    "(Redis lock backend %r).",
                    "permit" if permit else "shared",
                    name,
                    self.alias,
                )
            done.append(ok)
        return done

    def _kind_release_steps(self, lease: Lease) -> Generator[tuple, Any, bool]:
        keys = self._kind_keys(lease.name, lease.kind)
        release = ("eval", keys.release, keys.five, [lease.token, keys.wake])
        try:
            code = yield release
        except GeneratorExit:
            # As the exclusive release: sent again in the background.
            if (left := lease.remaining()) > 0:
                item = (lease.name, lease.token, lease.kind.mode == "permit")
                self.kinds_in_doubt.add(item, left)
            raise
        except BaseException:
            yield release  # harmless twice, as the exclusive release
            raise
        return code != 0

    def _kind_extend_steps(
        self, lease: Lease, ttl: float
    ) -> Generator[tuple, Any, bool]:
        keys = self._kind_keys(lease.name, lease.kind)
        sent = time.monotonic()
        ok = yield ("eval", HELD, keys.held, [lease.token, ms(ttl), keys.mark])
        if ok:
            lease.deadline = sent + ttl
        return bool(ok)

    def _kind_is_held_steps(self, lease: Lease) -> Generator[tuple, Any, bool]:
        keys = self._kind_keys(lease.name, lease.kind)
        ok = yield ("eval", HELD, keys.held, [lease.token, 0, keys.mark])
        return bool(ok)

"""The lock handle: ``lock(name)`` as context manager, decorator and object."""

from __future__ import annotations

import asyncio
import functools
import time
from contextlib import ContextDecorator
from inspect import iscoroutinefunction
from typing import Any

from .backends.base import EXCLUSIVE, SHARED, BaseLockBackend, Kind, Lease
from .busy import refuse_kind
from .exceptions import InvalidLockBackendError, LockBackendError, LockLost
from .handler import DEFAULT_LOCK_ALIAS, amissing_table, locks, missing_table
from .holding import DEFAULT, Holding, release_log
from .losses import LossEvent, _cancellers, _loss_event
from .options import option_problems, seconds_problem, timeout_problem

__all__ = ["DEFAULT", "Lock", "LossEvent", "lock"]


def _check_seconds(name: str, what: str, value: Any) -> float:
    """Return ``value`` if it is a positive, finite number of seconds."""
    problem = seconds_problem(what, value)
    if problem:
        error, text = problem
        raise error(f"Lock {name!r}: {text}.")
    return value


class Lock(Holding, ContextDecorator):
    """A handle on one named lock of one backend.

    Use it as a context manager (``with lock("x") as held:``, or ``async
    with``), as a decorator (``@lock("x")``: each call takes the lock afresh),
    or through :meth:`acquire` / :meth:`release` like :class:`threading.Lock`.

    A handle holds at most one lease at a time, except on a reentrant
    backend, where nested acquisitions stack and are released in turn.
    ``shared=True`` takes a shared lease (see :func:`lock`).
    """

    #: What the handle acquires; a subclass (Semaphore) asks for permits.
    kind: Kind = EXCLUSIVE

    def __init__(
        self,
        name: str,
        *,
        using: str = DEFAULT_LOCK_ALIAS,
        ttl: float | None = None,
        timeout: float | None = DEFAULT,
        auto_renew: bool | None = None,
        on_lost: str = "raise",
        max_hold: float | None = DEFAULT,
        shared: bool = False,
    ):
        if not isinstance(name, str):
            raise TypeError(
                f"A lock name must be a str, not {name!r} ({type(name).__name__})."
            )
        if not (
            ttl is None
            and timeout is DEFAULT
            and (auto_renew is None or auto_renew is False or auto_renew is True)
            and using.__class__ is str
            and on_lost == "raise"
            and max_hold is DEFAULT
        ):
            problems = option_problems(
                using=using,
                ttl=ttl,
                timeout=None if timeout is DEFAULT else timeout,
                auto_renew=auto_renew,
                on_lost=on_lost,
                max_hold=None if max_hold is DEFAULT else max_hold,
            )
            if problems:
                error, text = problems[0]
                raise error(f"Lock {name!r}: {text}.")
        if shared is not False:
            if shared is not True:
                raise TypeError(
                    f"Lock {name!r}: shared must be a bool, not {shared!r}."
                )
            self.kind = SHARED
        self.name = name
        self.using = using
        self._ttl = ttl
        self._timeout = timeout
        self._auto_renew = auto_renew
        self.on_lost = on_lost
        self._max_hold = max_hold
        self._cancel_on_lost = on_lost == "cancel"
        self._leases: list[tuple[Lease, Any, BaseLockBackend]] = []
        self._last_lease: Lease | None = None

    def __repr__(self) -> str:
        state = "held" if self._leases else "unheld"
        shared = " shared" if self.kind is SHARED else ""
        return f"<Lock {self.name!r} using={self.using!r}{shared} {state}>"

    # -- resolved options -------------------------------------------------

    @property
    def backend(self) -> BaseLockBackend:
        """The backend of this lock's alias."""
        return self._backend()

    @property
    def ttl(self) -> float:
        """The lease length in seconds."""
        return self._ttl if self._ttl is not None else self.backend.default_ttl

    @property
    def timeout(self) -> float | None:
        """How long :meth:`acquire` waits by default (None: forever)."""
        return self._wait_for(self.backend, True, DEFAULT)

    @property
    def auto_renew(self) -> bool:
        """Whether held leases are renewed in the background."""
        if self._auto_renew is None:
            return self.backend.auto_renew
        return self._auto_renew

    @property
    def max_hold(self) -> float | None:
        """Seconds after acquisition when auto-renewal stops (None: never)."""
        if self._max_hold is DEFAULT:
            return self.backend.max_hold
        return self._max_hold

    @property
    def lease(self) -> Lease | None:
        """The innermost lease this handle holds, or None."""
        return self._leases[-1][0] if self._leases else None

    @property
    def lost(self) -> LossEvent:
        """The :class:`LossEvent` of the held lease (else of the last one held).

        Set as soon as the lease is known lost, while the block still runs:
        synchronous work checks ``held.lost.is_set()`` (or waits on it) to
        stop early. Unset on a handle that never held the lock.
        """
        lease = self.lease or self._last_lease
        if lease is None:
            return LossEvent()
        return _loss_event(lease)

    @property
    def fencing_token(self) -> int | None:
        """The fencing token of the held lease (None when not held)."""
        lease = self.lease
        return lease.fencing_token if lease is not None else None

    def _wait_for(
        self, backend: BaseLockBackend, blocking: bool, timeout: float | None
    ) -> float | None:
        if not blocking:
            return 0
        if timeout is DEFAULT:
            timeout = self._timeout
            return backend.default_timeout if timeout is DEFAULT else timeout
        problem = timeout_problem(timeout, forever=(None, -1))
        if problem:
            error, text = problem
            raise error(f"Lock {self.name!r}: {text}.")
        if timeout is None or timeout == -1:
            return None
        return timeout

    # -- sync API ---------------------------------------------------------

    def acquire(self, blocking: bool = True, timeout: float | None = DEFAULT) -> bool:
        """Acquire the lock; return False if it stayed busy for ``timeout``.

        ``blocking=False`` tries once. Raise LockBackendError if the backend
        cannot be reached.
        """
        if self._cancel_on_lost:
            raise TypeError(
                f"Lock {self.name!r}: on_lost='cancel' cancels the asyncio task "
                "holding the lock, and synchronous code has none; use 'async with', "
                "or check held.lost in synchronous code."
            )
        try:  # _backend(), inline
            backend = locks[self.using]
        except InvalidLockBackendError:
            self._no_such_alias()
            raise
        if blocking and timeout is DEFAULT:  # _wait_for's common case, inline
            wait = self._timeout
            if wait is DEFAULT:
                wait = backend.default_timeout
        else:
            wait = self._wait_for(backend, blocking, timeout)
        ttl = self._ttl
        if ttl is None:
            ttl = backend.default_ttl
        started = time.monotonic()
        try:
            if self.kind is EXCLUSIVE:
                lease = backend.acquire(self.name, ttl, wait)
            else:
                lease = backend.acquire(self.name, ttl, wait, self._kind_of(backend))
        except LockBackendError as e:
            self._failed(backend, started, e)
            missing_table(backend, e)
            raise
        return self._acquired(backend, lease, started, wait)

    def release(self) -> None:
        """Release the lock.

        Raise LockNotHeld if this handle does not hold it, and LockLost if its
        lease expired or was taken over before the release.
        """
        backend, lease = self._pop()
        if lease.lost:
            # Nothing of ours is left to delete (and the backend may be down).
            self._lost(backend, lease, "the lease was lost earlier")
        ok = backend.release(lease)
        self._released(backend, lease, ok)

    def extend(self, seconds: float | None = None) -> None:
        """Make the lease expire ``seconds`` (default: the ttl) from now.

        Raise LockNotHeld if this handle does not hold the lock, LockLost if
        it held it and lost it.
        """
        backend, lease = self._current()
        seconds = (
            self.ttl
            if seconds is None
            else _check_seconds(self.name, "seconds", seconds)
        )
        if not backend.extend(lease, seconds):
            self._lost(backend, lease, "extend found the lease gone")

    def locked(self) -> bool:
        """Return True while this handle still holds the lock (asks the backend)."""
        lease = self.lease
        if lease is None or lease.lost:
            return False
        return self.backend.is_held(lease)

    def __enter__(self) -> Lock:
        if not self.acquire():
            try:
                if self.kind is EXCLUSIVE:
                    holder = self.backend.holder_of(self.name)
                else:
                    holder = self.backend.holder_of(self.name, self.kind)
            except Exception:
                holder = self._holder_unknown()
            raise self._not_acquired(holder)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            # release(), inlined as in __aexit__: one call less per cycle.
            backend, lease = self._pop()
            if lease.lost:
                self._lost(backend, lease, "the lease was lost earlier")
            ok = backend.release(lease)
            self._released(backend, lease, ok)
        except LockLost:
            if exc_type is None:
                raise
            # The block's own exception propagates; the loss was signalled.
        except Exception:
            if exc_type is None:
                raise
            release_log.exception("Releasing lock %r failed", self.name)

    # -- async API --------------------------------------------------------

    async def aacquire(
        self, blocking: bool = True, timeout: float | None = DEFAULT
    ) -> bool:
        """Async twin of :meth:`acquire`."""
        backend = self._backend()
        wait = self._wait_for(backend, blocking, timeout)
        ttl = self._ttl if self._ttl is not None else backend.default_ttl
        started = time.monotonic()
        kind = self.kind
        try:
            if kind is EXCLUSIVE:
                lease = await backend.aacquire(self.name, ttl, wait)
            else:
                kind = self._kind_of(backend)
                lease = await backend.aacquire(self.name, ttl, wait, kind)
        except LockBackendError as e:
            self._failed(backend, started, e)
            await amissing_table(backend, e)
            raise
        return self._acquired(backend, lease, started, wait, asynchronous=True)

    async def arelease(self) -> None:
        """Async twin of :meth:`release`."""
        backend, lease = self._pop()
        if lease.lost:
            self._lost(backend, lease, "the lease was lost earlier")
        ok = await backend.arelease(lease)
        self._released(backend, lease, ok)

    async def aextend(self, seconds: float | None = None) -> None:
        """Async twin of :meth:`extend`."""
        backend, lease = self._current()
        seconds = (
            self.ttl
            if seconds is None
            else _check_seconds(self.name, "seconds", seconds)
        )
        if not await backend.aextend(lease, seconds):
            self._lost(backend, lease, "extend found the lease gone")

    async def alocked(self) -> bool:
        """Async twin of :meth:`locked`."""
        lease = self.lease
        if lease is None or lease.lost:
            return False
        return await self.backend.ais_held(lease)

    async def __aenter__(self) -> Lock:
        # aacquire(), inlined: one coroutine less per cycle.
        backend = self._backend()
        wait = self._wait_for(backend, True, DEFAULT)
        ttl = self._ttl if self._ttl is not None else backend.default_ttl
        started = time.monotonic()
        kind = self.kind
        try:
            if kind is EXCLUSIVE:
                lease = await backend.aacquire(self.name, ttl, wait)
            else:
                kind = self._kind_of(backend)
                lease = await backend.aacquire(self.name, ttl, wait, kind)
        except LockBackendError as e:
            self._failed(backend, started, e)
            await amissing_table(backend, e)
            raise
        if not self._acquired(backend, lease, started, wait, asynchronous=True):
            try:
                if kind is EXCLUSIVE:
                    holder = await backend.aholder_of(self.name)
                else:
                    holder = await backend.aholder_of(self.name, kind)
            except Exception:
                holder = self._holder_unknown()
            raise self._not_acquired(holder)
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        canceller = None
        if self._cancel_on_lost and self._leases:
            canceller = _cancellers.get(self._leases[-1][0])
        if canceller is not None and canceller.fired:
            canceller.active = False
            uncancel = getattr(canceller.task, "uncancel", None)  # Python 3.11+
            others = uncancel() if uncancel is not None else 0
            if (
                exc_type is not None
                and issubclass(exc_type, asyncio.CancelledError)
                and not others
            ):
                # The cancellation was ours: the caller gets the loss it
                # stands for, not a CancelledError it never asked for.
                backend, lease = self._pop()
                try:
                    self._lost(backend, lease, "the lease was lost while the block ran")
                except LockLost as lost:
                    raise lost from exc
        try:
            # arelease(), inlined: one coroutine less per cycle.
            backend, lease = self._pop()
            if lease.lost:
                self._lost(backend, lease, "the lease was lost earlier")
            ok = await backend.arelease(lease)
            self._released(backend, lease, ok)
        except LockLost:
            if exc_type is None:
                raise
        except Exception:
            if exc_type is None:
                raise
            release_log.exception("Releasing lock %r failed", self.name)

    # -- decorator --------------------------------------------------------

    def _recreate_cm(self) -> Lock:
        # A handle keeps state, so every decorated call gets a fresh one.
        return Lock(self.name, **self._options())

    def _options(self) -> dict[str, Any]:
        options = {
            "using": self.using,
            "ttl": self._ttl,
            "timeout": self._timeout,
            "auto_renew": self._auto_renew,
            "on_lost": self.on_lost,
            "max_hold": self._max_hold,
        }
        if self.kind is SHARED:
            options["shared"] = True
        return options

    def _kind_of(self, backend: BaseLockBackend) -> Kind:
        """Return the handle's kind if ``backend`` offers it, before any call."""
        kind = self.kind
        if kind.mode not in backend.kinds:
            refuse_kind(self.name, kind, backend)
        return kind

    def __call__(self, func):
        if iscoroutinefunction(func):

            @functools.wraps(func)
            async def inner(*args, **kwargs):
                async with self._recreate_cm():
                    return await func(*args, **kwargs)

            return inner
        return super().__call__(func)


def lock(
    name: str,
    *,
    using: str = DEFAULT_LOCK_ALIAS,
    ttl: float | None = None,
    timeout: float | None = DEFAULT,
    auto_renew: bool | None = None,
    on_lost: str = "raise",
    max_hold: float | None = DEFAULT,
    shared: bool = False,
) -> Lock:
    """Return a :class:`Lock` handle for ``name`` on the ``using`` alias.

    ``ttl`` is the lease length in seconds, ``timeout`` how long to wait for
    the lock (None: forever, 0: try once), ``auto_renew`` whether the lease
    is renewed in the background while held. Each defaults to the alias's
    ``LOCKS`` setting.

    ``on_lost`` says what a lease lost while the block runs does: ``"raise"``
    reports it when the block ends (``LockLost``); ``"cancel"`` also cancels
    the asyncio task running the block as soon as the loss is known, and
    ``async with`` then raises ``LockLost``. Either way ``held.lost`` is set
    at that moment.

    ``max_hold`` bounds a hold that auto-renewal keeps alive: renewal stops
    that many seconds after acquisition and the lease runs out (within one
    ``ttl``), which is reported as a loss. It defaults to the alias's
    ``MAX_HOLD``; None means no bound.

    ``shared=True`` takes a shared (read) lease: shared holders of a name
    coexist and exclude exclusive holders, which exclude everyone; once an
    exclusive request waits, new shared requests wait behind it. A backend
    that does not offer shared locks raises InvalidLockBackendError (an
    ImproperlyConfigured) before any round trip. A shared holder cannot make
    fenced writes.
    """
    # Lock(name, using=..., ...) would pack the keywords into a dict for
    # __init__ (a class call does); calling __init__ as a method does not,
    # which makes the handle of every cycle about a third cheaper to create.
    handle = object.__new__(Lock)
    handle.__init__(
        name,
        using=using,
        ttl=ttl,
        timeout=timeout,
        auto_renew=auto_renew,
        on_lost=on_lost,
        max_hold=max_hold,
        shared=shared,
    )
    return handle

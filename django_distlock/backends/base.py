"""The contract every lock backend fulfils.

A backend is created once per ``LOCKS`` alias and process by
:data:`django_distlock.locks` and is shared by every thread of the process.
It hands out :class:`Lease` objects; the :class:`~django_distlock.locks.Lock`
handle, the watchdog and the management command only ever talk to a backend
through the methods below.

Time arguments are seconds (floats). ``timeout`` follows :mod:`threading`:
``None`` waits forever, ``0`` tries once, a positive number waits that long.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async

from ..exceptions import LockNotHeld
from .handoff import Handoff
from .holders import Holder
from .kinds import EXCLUSIVE, SHARED, Kind, permit
from .options import Option, check_options

__all__ = [
    "EXCLUSIVE",
    "SHARED",
    "BaseLockBackend",
    "Holder",
    "Kind",
    "Lease",
    "Option",
    "holder_identity",
    "new_token",
    "permit",
]

DEFAULT_TTL = 30.0
DEFAULT_TIMEOUT = 10.0
DEFAULT_KEY_PREFIX = "distlock"

_HOST = socket.gethostname()


#: This process's id, kept current across forks: os.getpid() is a system
#: call, and every acquisition needs the pid.
_pid = os.getpid()


def _after_fork() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_after_fork)


def current_pid() -> int:
    """Return this process's id (cached; updated in a forked child)."""
    return _pid


def new_token() -> str:
    """Return a fresh unguessable lease token (128 bits of randomness, hex)."""
    # secrets.token_hex(16), without its two Python-level calls per lease.
    return os.urandom(16).hex()


def running_task() -> asyncio.Task | None:
    """Return the running asyncio task, or None outside one."""
    if sys.get_asyncgen_hooks().firstiter is None:
        # No event loop runs in this thread: a running asyncio loop (and
        # uvloop) installs its asynchronous generator hooks (PEP 525) in its
        # thread. This test spares the synchronous path the RuntimeError that
        # current_task() raises without a loop, its costliest step.
        # busy.caller() repeats it inline, on the path of every cycle.
        return None
    try:
        return asyncio.current_task()
    except RuntimeError:  # hooks of another kind, and no running event loop
        return None


def holder_identity() -> tuple[str, int, str]:
    """Return ``(host, pid, thread)`` describing the caller, for listings."""
    thread = threading.current_thread().name
    task = running_task()
    if task is not None:
        thread = f"{thread}/{task.get_name()}"
    return _HOST, _pid, thread


@dataclass(eq=False)
class Lease:
    """One acquisition of a lock, as a backend hands it out.

    ``deadline`` is a :func:`time.monotonic` instant by which the lease has
    surely expired unless renewed: it is measured from just before the
    acquiring request was sent, so it errs early. ``kind`` says whether it is
    an exclusive lease, a shared one or a semaphore permit. ``state`` is
    private to the backend that made the lease.
    """

    alias: str
    name: str
    token: str
    fencing_token: int
    ttl: float
    deadline: float
    acquired_at: float = field(default_factory=time.time)
    pid: int = field(default_factory=current_pid)
    state: Any = None
    lost: bool = False
    lost_reported: bool = False
    kind: Kind = EXCLUSIVE

    def remaining(self) -> float:
        """Return the seconds left before the lease expires, as seen locally."""
        return self.deadline - time.monotonic()

    def check_owner_process(self) -> None:
        """Raise LockNotHeld if called from a process other than the acquirer."""
        if self.pid != _pid:
            raise LockNotHeld(
                f"Lock {self.name!r} was acquired in process {self.pid}; "
                f"a forked child cannot release or extend it.",
                name=self.name,
            )


class BaseLockBackend:
    """Base class of lock backends: the contract, one method at a time.

    Subclasses implement the synchronous methods; the ``a``-prefixed twins
    default to running them in a thread and may be overridden by backends
    with a native asyncio client.
    """

    #: True if the same owner may acquire a lock it already holds.
    reentrant = False
    #: The kinds of acquisition (:class:`~.kinds.Kind` modes) the backend
    #: offers; the lock handle refuses the others before calling it.
    kinds: frozenset[str] = frozenset({"exclusive"})
    #: True if fencing tokens survive server restarts and failovers, so that
    #: ``save(fence=...)`` can rely on them.
    durable_fencing = True
    #: The driver modules the backend imports, each with the extra of
    #: ``django-distlock`` that installs it; a system check (``distlock.E019``)
    #: names the ``pip install`` line when one is missing.
    drivers: tuple[tuple[str, str], ...] = ()
    #: The keys of ``OPTIONS`` the backend reads, each with the
    #: :class:`~.options.Option` that checks its value: the system checks
    #: report any other key, and a bad value, with :attr:`options_check_id`
    #: (or the option's own id). None: OPTIONS are not checked.
    options_schema: Mapping[str, Option] | None = None
    #: The check id of an unknown or ill-typed OPTIONS key.
    options_check_id = "distlock.E009"

    #: Called as ``loss_reporter(backend, lease, reason)`` for a loss the
    #: backend finds on its own; the handler that creates the backend sets it
    #: (to the watchdog's reporter). None: the loss is only marked.
    loss_reporter: Callable[[BaseLockBackend, Lease, str], None] | None = None

    def __init__(self, alias: str, params: dict[str, Any]):
        self.alias = alias
        self.params = params
        self.default_ttl = float(params.get("TTL", DEFAULT_TTL))
        timeout = params.get("TIMEOUT", DEFAULT_TIMEOUT)
        self.default_timeout = None if timeout is None else float(timeout)
        self.auto_renew = bool(params.get("AUTO_RENEW", True))
        max_hold = params.get("MAX_HOLD")
        #: Seconds after which auto-renewal of a lease stops (None: never).
        self.max_hold = None if max_hold is None else float(max_hold)
        self.key_prefix = str(params.get("KEY_PREFIX", DEFAULT_KEY_PREFIX))
        self.options = dict(params.get("OPTIONS") or {})

    def __repr__(self) -> str:
        return f"<{type(self).__name__} alias={self.alias!r}>"

    # -- system checks ----------------------------------------------------

    @classmethod
    def check(cls, alias: str, params: dict[str, Any]) -> list:
        """Return the system check messages of the ``LOCKS[alias]`` entry.

        Its OPTIONS read against :attr:`options_schema`, then the messages of
        :meth:`check_entry`. Backends override :meth:`check_entry`, not this.
        """
        return check_options(cls, alias, params) + cls.check_entry(alias, params)

    @classmethod
    def check_entry(cls, alias: str, params: dict[str, Any]) -> list:
        """Return check messages for what :attr:`options_schema` cannot declare.

        Rules that tie settings together (LOCATION's form, an option that
        needs another, a database the backend cannot use). Called after the
        schema's checks, whatever they found.
        """
        return []

    # -- the lock itself --------------------------------------------------

    def acquire(
        self, name: str, ttl: float, timeout: float | None, kind: Kind = EXCLUSIVE
    ) -> Lease | None:
        """Acquire ``name`` for ``ttl`` seconds, waiting up to ``timeout``.

        ``kind`` (one of :attr:`kinds`) asks for an exclusive lease, a shared
        one, or a permit of a semaphore: an exclusive waiter queues new
        shared requests behind it; permits are granted in FIFO order; a
        permit whose ``limit`` differs from the one its current holders
        passed raises ValueError. Return the Lease, or None if the lock
        stayed busy for the whole wait. Raise LockBackendError if the backend
        cannot be reached.
        """
        raise NotImplementedError(
            "subclasses of BaseLockBackend must provide an acquire() method"
        )

    def release(self, lease: Lease) -> bool:
        """Release ``lease``; return False if it was no longer held by its owner."""
        raise NotImplementedError(
            "subclasses of BaseLockBackend must provide a release() method"
        )

    def extend(self, lease: Lease, ttl: float) -> bool:
        """Make ``lease`` expire ``ttl`` seconds from now; False if not held.

        On success, move ``lease.deadline`` accordingly.
        """
        raise NotImplementedError(
            "subclasses of BaseLockBackend must provide an extend() method"
        )

    def is_held(self, lease: Lease) -> bool:
        """Return True if ``lease`` is still the holder of its lock."""
        raise NotImplementedError(
            "subclasses of BaseLockBackend must provide an is_held() method"
        )

    def renew(self, leases: Iterable[Lease]) -> list[bool | None]:
        """Renew each lease for its own ttl; True, False (lost) or None (error).

        Backends that can batch the round trips override this.
        """
        results: list[bool | None] = []
        for lease in leases:
            try:
                results.append(self.extend(lease, lease.ttl))
            except Exception:
                results.append(None)
        return results

    # -- operations: listing and clearing ---------------------------------

    def holders(self, prefix: str = "") -> Iterator[Holder]:
        """Yield every active holder whose lock name starts with ``prefix``.

        ``prefix`` is literal: no character has a special meaning.
        """
        raise NotImplementedError(
            "subclasses of BaseLockBackend must provide a holders() method"
        )

    def holder_of(self, name: str, kind: Kind = EXCLUSIVE) -> Holder | None:
        """Return the holder that keeps ``kind`` of ``name`` busy, or None.

        Called once after an acquisition found the lock busy, to name the
        holder in ``LockNotAcquired``: for a permit, the permit that expires
        first. This default reads the listing; backends that can look one
        name up in a single round trip override it.
        """
        semaphore = kind.mode == "permit"
        found = None
        for holder in self.holders(prefix=name):
            if holder.name != name or (holder.kind.mode == "permit") != semaphore:
                continue
            if kind.mode == "shared" and holder.kind.mode == "shared":
                continue
            if found is None or (holder.expires_ts or 0) < (found.expires_ts or 0):
                found = holder
        return found

    def force_release(self, name: str, token: str, kind: Kind = EXCLUSIVE) -> bool:
        """Delete the lease of ``name`` if its token is still ``token``.

        ``kind`` is the listed holder's: a permit lives apart from locks of
        the same name; the other holders of a shared lock or a semaphore are
        left alone. A lock re-taken since it was listed is left alone;
        fencing counters are never reset. Return True if a lease was removed.
        """
        raise NotImplementedError(
            "subclasses of BaseLockBackend must provide a force_release() method"
        )

    def force_release_many(self, items: Iterable[tuple]) -> list[bool]:
        """Force-release each ``(name, token)`` or ``(name, token, kind)``.

        Return one result per item. Backends that can batch the round trips
        override this.
        """
        return [self.force_release(*item) for item in items]

    def clear_stale(self) -> int:
        """Remove expired or orphaned lock records, never a live lease.

        Return how many records were removed.
        """
        return 0

    def report_loss(self, lease: Lease, reason: str) -> None:
        """Mark ``lease`` lost and report it (the ``lock_lost`` signal, the log)."""
        lease.lost = True
        if self.loss_reporter is not None:
            self.loss_reporter(self, lease, reason)

    def close(self) -> None:
        """Release the backend's connections (called on ``setting_changed``)."""

    # -- asyncio twins ----------------------------------------------------

    async def aacquire(
        self, name: str, ttl: float, timeout: float | None, kind: Kind = EXCLUSIVE
    ) -> Lease | None:
        """Async twin of :meth:`acquire`.

        In a thread of a pool for waits (:data:`~.handoff.MAX_WAITS`), not
        the thread-sensitive one nor the event loop's default executor: a
        waiting acquire blocks its thread, and there it would hold up the
        holder's ``arelease`` queued behind it (a deadlock until the
        timeout). If the awaiting task
        is cancelled, a lease the thread obtains afterwards is released at
        once (:class:`~.handoff.Handoff`): nobody would hold it.
        """

        def undo(lease: Lease | None) -> None:
            if lease is not None:
                self.release(lease)

        wait = Handoff(undo).await_wait
        if kind is EXCLUSIVE:
            return await wait(self.acquire, name, ttl, timeout)
        return await wait(self.acquire, name, ttl, timeout, kind)

    async def aholder_of(self, name: str, kind: Kind = EXCLUSIVE) -> Holder | None:
        """Async twin of :meth:`holder_of`."""
        return await sync_to_async(self.holder_of, thread_sensitive=False)(name, kind)

    async def arelease(self, lease: Lease) -> bool:
        """Async twin of :meth:`release`."""
        return await sync_to_async(self.release, thread_sensitive=True)(lease)

    async def aextend(self, lease: Lease, ttl: float) -> bool:
        """Async twin of :meth:`extend`."""
        return await sync_to_async(self.extend, thread_sensitive=True)(lease, ttl)

    async def ais_held(self, lease: Lease) -> bool:
        """Async twin of :meth:`is_held`."""
        return await sync_to_async(self.is_held, thread_sensitive=True)(lease)

    async def arenew(self, leases: Iterable[Lease]) -> list[bool | None]:
        """Async twin of :meth:`renew`.

        Not thread-sensitive: a renewal must not queue behind synchronous
        work (sync views) while its leases run out.
        """
        return await sync_to_async(self.renew, thread_sensitive=False)(list(leases))

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
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from operator import attrgetter
from typing import Any

from asgiref.sync import sync_to_async

from ..exceptions import LockNotHeld
from .handoff import Handoff

__all__ = ["BaseLockBackend", "Holder", "Lease", "holder_identity", "new_token"]

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
    """Return a fresh unguessable lease token (128 bits of randomness)."""
    return secrets.token_urlsafe(16)


def running_task() -> asyncio.Task | None:
    """Return the running asyncio task, or None outside one."""
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running event loop: the synchronous path
        return None


def current_task_name() -> str | None:
    """Return the name of the running asyncio task, or None outside one."""
    task = running_task()
    return task.get_name() if task is not None else None


def holder_identity() -> tuple[str, int, str]:
    """Return ``(host, pid, thread)`` describing the caller, for listings."""
    thread = threading.current_thread().name
    task = current_task_name()
    if task is not None:
        thread = f"{thread}/{task}"
    return _HOST, _pid, thread


@dataclass(eq=False)
class Lease:
    """One acquisition of a lock, as a backend hands it out.

    ``deadline`` is a :func:`time.monotonic` instant by which the lease has
    surely expired unless renewed: it is measured from just before the
    acquiring request was sent, so it errs early. ``state`` is private to the
    backend that made the lease.
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


#: The instant a Holder's epoch-millisecond times count from.
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
#: ``datetime.isoformat()`` of a UTC instant is "<second><fraction>+00:00";
#: the millisecond fractions, and a small memo of the seconds (the holders of
#: one listing were mostly taken within a few seconds of each other).
_ISO_FRACTIONS = ("+00:00", *(f".{ms:03d}000+00:00" for ms in range(1, 1000)))
_ISO_SECONDS: dict[int, str] = {}
_ISO_SECONDS_MAX = 4096


def _iso_second(second: int) -> str:
    """Return the ``isoformat()`` of a whole second, without its UTC offset."""
    text = _ISO_SECONDS.get(second)
    if text is None:
        if len(_ISO_SECONDS) >= _ISO_SECONDS_MAX:
            _ISO_SECONDS.clear()
        text = (_EPOCH + timedelta(seconds=second)).isoformat()[:-6]
        _ISO_SECONDS[second] = text
    return text


def _isoformat(value: datetime | int | None, timespec: str) -> str | None:
    """Return ``value`` (a datetime or epoch milliseconds) as ISO 8601."""
    if value is None:
        return None
    if type(value) is not int:
        return value.isoformat(timespec=timespec)
    second, ms = divmod(value, 1000)
    if timespec == "auto":
        return _iso_second(second) + _ISO_FRACTIONS[ms]
    if timespec == "seconds":
        return _iso_second(second) + "+00:00"
    return (_EPOCH + timedelta(milliseconds=value)).isoformat(timespec=timespec)


def _as_datetime(value: datetime | int | None) -> datetime | None:
    if type(value) is not int:
        return value
    return _EPOCH + timedelta(milliseconds=value)


def _as_timestamp(value: datetime | int | None) -> float | None:
    if value is None:
        return None
    if type(value) is not int:
        return value.timestamp()
    return value / 1000


_encode = json.encoder.encode_basestring_ascii


class Holder:
    """An active holder as a backend lists it (command, admin page).

    Immutable and compared by value, like a frozen dataclass of the fields
    ``backend``, ``name``, ``token``, ``host``, ``pid``, ``thread``,
    ``acquired_at``, ``expires_at`` (aware UTC datetimes, or None) and
    ``fencing_token``.

    A listing builds holders by the hundred thousand, so they are cheap to
    make: plain slots behind read-only properties, and a backend that reads
    its times as epoch milliseconds builds them with :meth:`from_ms`, which
    makes the datetimes only when they are asked for (a listing that prints
    them uses :meth:`isoformat`, which needs none).
    """

    __slots__ = (
        "_backend",
        "_name",
        "_token",
        "_host",
        "_pid",
        "_thread",
        "_acquired",
        "_expires",
        "_fencing_token",
    )

    def __init__(
        self,
        backend: str,
        name: str,
        token: str,
        host: str = "",
        pid: int | None = None,
        thread: str = "",
        acquired_at: datetime | None = None,
        expires_at: datetime | None = None,
        fencing_token: int | None = None,
    ):
        self._backend = backend
        self._name = name
        self._token = token
        self._host = host
        self._pid = pid
        self._thread = thread
        self._acquired = acquired_at
        self._expires = expires_at
        self._fencing_token = fencing_token

    @classmethod
    def from_ms(
        cls,
        backend: str,
        name: str,
        token: str,
        host: str,
        pid: int | None,
        thread: str,
        acquired_ms: int | None,
        expires_ms: int | None,
        fencing_token: int | None,
    ) -> Holder:
        """Return a holder whose times are given in epoch milliseconds (UTC)."""
        self = cls(backend, name, token, host, pid, thread, None, None, fencing_token)
        # Kept as numbers; the datetimes are built only if they are read.
        self._acquired = acquired_ms
        self._expires = expires_ms
        return self

    backend = property(attrgetter("_backend"), doc="The LOCKS alias.")
    name = property(attrgetter("_name"), doc="The lock name, in full.")
    token = property(attrgetter("_token"), doc="The lease's token.")
    host = property(attrgetter("_host"), doc="The holder's host name.")
    pid = property(attrgetter("_pid"), doc="The holder's process id.")
    thread = property(attrgetter("_thread"), doc="The holder's thread (/task).")
    fencing_token = property(attrgetter("_fencing_token"), doc="The lease's fence.")

    @property
    def acquired_at(self) -> datetime | None:
        """When the lease was taken (aware, UTC), or None if unknown."""
        return _as_datetime(self._acquired)

    @property
    def expires_at(self) -> datetime | None:
        """When the lease expires unless renewed (aware, UTC), or None."""
        return _as_datetime(self._expires)

    @property
    def acquired_ts(self) -> float | None:
        """``acquired_at`` as a POSIX timestamp, or None."""
        return _as_timestamp(self._acquired)

    @property
    def expires_ts(self) -> float | None:
        """``expires_at`` as a POSIX timestamp, or None."""
        expires = self._expires
        if type(expires) is int:
            return expires / 1000
        return _as_timestamp(expires)

    @property
    def holder(self) -> str:
        """Return ``host:pid/thread`` for display."""
        return f"{self._host}:{self._pid}/{self._thread}"

    def isoformat(self, timespec: str = "auto") -> tuple[str | None, str | None]:
        """Return ``(acquired_at, expires_at)`` as ``datetime.isoformat`` does.

        None stands for an unknown time.
        """
        acquired, expires = self._acquired, self._expires
        if type(acquired) is int and type(expires) is int:
            # A listing's common case, inline: no call per time.
            a_second, a_ms = divmod(acquired, 1000)
            e_second, e_ms = divmod(expires, 1000)
            a_text = _ISO_SECONDS.get(a_second) or _iso_second(a_second)
            e_text = _ISO_SECONDS.get(e_second) or _iso_second(e_second)
            if timespec == "auto":
                return a_text + _ISO_FRACTIONS[a_ms], e_text + _ISO_FRACTIONS[e_ms]
            if timespec == "seconds":
                return a_text + "+00:00", e_text + "+00:00"
        return _isoformat(acquired, timespec), _isoformat(expires, timespec)

    def as_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict (the token is never included)."""
        acquired, expires = self.isoformat()
        return {
            "backend": self._backend,
            "name": self._name,
            "holder": {"host": self._host, "pid": self._pid, "thread": self._thread},
            "acquired_at": acquired,
            "expires_at": expires,
            "fencing_token": self._fencing_token,
        }

    def as_json(self) -> str:
        """Return ``json.dumps(self.as_dict())``, made without the dict."""
        pid, fence = self._pid, self._fencing_token
        if not (pid is None or type(pid) is int) or not (
            fence is None or type(fence) is int
        ):
            return json.dumps(self.as_dict())
        acquired, expires = self.isoformat()
        # ISO 8601 times need no escaping (digits and "-:T.+"), only quotes.
        acquired = "null" if acquired is None else '"' + acquired + '"'
        expires = "null" if expires is None else '"' + expires + '"'
        return (
            f'{{"backend": {_encode(self._backend)}, "name": {_encode(self._name)}, '
            f'"holder": {{"host": {_encode(self._host)}, '
            f'"pid": {"null" if pid is None else pid}, '
            f'"thread": {_encode(self._thread)}}}, '
            f'"acquired_at": {acquired}, "expires_at": {expires}, '
            f'"fencing_token": {"null" if fence is None else fence}}}'
        )

    def _fields(self) -> tuple:
        return (
            self._backend,
            self._name,
            self._token,
            self._host,
            self._pid,
            self._thread,
            self.acquired_at,
            self.expires_at,
            self._fencing_token,
        )

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(backend={self._backend!r}, name={self._name!r}, "
            f"token={self._token!r}, host={self._host!r}, pid={self._pid!r}, "
            f"thread={self._thread!r}, acquired_at={self.acquired_at!r}, "
            f"expires_at={self.expires_at!r}, "
            f"fencing_token={self._fencing_token!r})"
        )


class BaseLockBackend:
    """Base class of lock backends: the contract, one method at a time.

    Subclasses implement the synchronous methods; the ``a``-prefixed twins
    default to running them in a thread and may be overridden by backends
    with a native asyncio client.
    """

    #: True if the same owner may acquire a lock it already holds.
    reentrant = False
    #: True if fencing tokens survive server restarts and failovers, so that
    #: ``save(fence=...)`` can rely on them.
    durable_fencing = True
    #: The driver modules the backend imports, each with the extra of
    #: ``django-distlock`` that installs it; a system check (``distlock.E019``)
    #: names the ``pip install`` line when one is missing.
    drivers: tuple[tuple[str, str], ...] = ()

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

    # -- the lock itself --------------------------------------------------

    def acquire(self, name: str, ttl: float, timeout: float | None) -> Lease | None:
        """Acquire ``name`` for ``ttl`` seconds, waiting up to ``timeout``.

        Return the Lease, or None if the lock stayed busy for the whole wait.
        Raise LockBackendError if the backend cannot be reached.
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

    def holder_of(self, name: str) -> Holder | None:
        """Return the current holder of ``name``, or None if it is free or unknown.

        Called once after an acquisition found the lock busy, to name the
        holder in ``LockNotAcquired``. This default reads the listing; backends
        that can look one name up in a single round trip override it.
        """
        for holder in self.holders(prefix=name):
            if holder.name == name:
                return holder
        return None

    def force_release(self, name: str, token: str) -> bool:
        """Delete the lease of ``name`` if its token is still ``token``.

        A lock re-taken since it was listed is left alone; fencing counters
        are never reset. Return True if a lease was removed.
        """
        raise NotImplementedError(
            "subclasses of BaseLockBackend must provide a force_release() method"
        )

    def force_release_many(self, items: Iterable[tuple[str, str]]) -> list[bool]:
        """Force-release each ``(name, token)``; return one result per item.

        Backends that can batch the round trips override this.
        """
        return [self.force_release(name, token) for name, token in items]

    def clear_stale(self) -> int:
        """Remove expired or orphaned lock records, never a live lease.

        Return how many records were removed.
        """
        return 0

    def close(self) -> None:
        """Release the backend's connections (called on ``setting_changed``)."""

    # -- asyncio twins ----------------------------------------------------

    async def aacquire(
        self, name: str, ttl: float, timeout: float | None
    ) -> Lease | None:
        """Async twin of :meth:`acquire`.

        Not thread-sensitive: a waiting acquire blocks its thread, and on the
        one thread-sensitive thread it would block the holder's ``arelease``
        queued behind it (a deadlock until the timeout). If the awaiting task
        is cancelled, a lease the thread obtains afterwards is released at
        once (:class:`~.handoff.Handoff`): nobody would hold it.
        """

        def undo(lease: Lease | None) -> None:
            if lease is not None:
                self.release(lease)

        return await Handoff(undo).arun(self.acquire, name, ttl, timeout)

    async def aholder_of(self, name: str) -> Holder | None:
        """Async twin of :meth:`holder_of`."""
        return await sync_to_async(self.holder_of, thread_sensitive=False)(name)

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

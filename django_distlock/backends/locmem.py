"""In-process backend for development and tests: threads of one process.

Like Django's locmem cache, each process has its own locks, so it gives no
mutual exclusion between processes; a system check warns when it is used
with ``DEBUG = False``.

It offers every kind of acquisition and is the reference for their
semantics: shared leases coexist and exclude exclusive ones, with writer
preference (a queued exclusive waiter makes new shared requests wait behind
it); semaphore permits live apart from locks and are granted in FIFO order.
A waiter's place is held by the waiting thread itself, so it vanishes when
the wait ends, whichever way.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from django.conf import settings
from django.core.checks import Warning

from .base import (
    EXCLUSIVE,
    SHARED,
    BaseLockBackend,
    Holder,
    Lease,
    holder_identity,
    new_token,
    permit,
)
from .kinds import limit_mismatch

__all__ = ["LocMemLockBackend"]

# One lock table per LOCATION, shared by every backend instance in the process.
_tables: dict[str, _Table] = {}
_tables_lock = threading.Lock()


@dataclass
class _Entry:
    token: str
    fence: int
    expires: float  # monotonic
    host: str
    pid: int
    thread: str
    acquired_at: float  # wall clock


class _Semaphore:
    """The permits of one semaphore name and the FIFO queue of its waiters."""

    __slots__ = ("limit", "holders", "queue")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.holders: dict[str, _Entry] = {}
        self.queue: deque[object] = deque()


def _prune(entries: dict[str, _Entry], now: float) -> dict[str, _Entry]:
    """Drop the expired entries of ``entries`` (token -> entry); return it."""
    for token in [t for t, e in entries.items() if e.expires <= now]:
        del entries[token]
    return entries


class _Table:
    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.entries: dict[str, _Entry] = {}
        #: name -> token -> entry of each shared holder.
        self.readers: dict[str, dict[str, _Entry]] = {}
        #: name -> how many exclusive waiters are queued (writer preference).
        self.writers_waiting: dict[str, int] = {}
        #: semaphore name -> its permits (a namespace apart from locks).
        self.semaphores: dict[str, _Semaphore] = {}
        self.last_fence = 0

    def next_fence(self) -> int:
        """Return a token above every earlier one, also those of earlier runs.

        The wall clock in microseconds keeps tokens increasing across process
        restarts (as the Redis backend does with the server clock); the
        counter covers several acquisitions within one microsecond.
        """
        self.last_fence = max(self.last_fence + 1, time.time_ns() // 1000)
        return self.last_fence

    def live(self, name: str, now: float) -> _Entry | None:
        entry = self.entries.get(name)
        if entry is not None and entry.expires <= now:
            del self.entries[name]
            return None
        return entry

    def live_readers(self, name: str, now: float) -> dict[str, _Entry]:
        readers = self.readers.get(name)
        if readers is None:
            return {}
        if not _prune(readers, now):
            del self.readers[name]
        return readers

    def live_semaphore(self, name: str, now: float) -> _Semaphore | None:
        semaphore = self.semaphores.get(name)
        if semaphore is not None:
            _prune(semaphore.holders, now)
            if not semaphore.holders and not semaphore.queue:
                del self.semaphores[name]
                return None
        return semaphore


def _first_expiry(entries) -> float:
    return min((e.expires for e in entries), default=math.inf)


class LocMemLockBackend(BaseLockBackend):
    """Locks held in this process's memory (``LOCATION`` names a separate table)."""

    kinds = frozenset({"exclusive", "shared", "permit"})
    #: It reads no OPTIONS: any key is reported (``distlock.E009``).
    options_schema: dict = {}

    def __init__(self, alias, params):
        super().__init__(alias, params)
        location = params.get("LOCATION") or ""
        with _tables_lock:
            self._table = _tables.setdefault(location, _Table())

    @classmethod
    def check_entry(cls, alias, params):
        """Warn when the locmem backend is used with ``DEBUG = False``."""
        if not settings.DEBUG:
            return [
                Warning(
                    f"LOCKS[{alias!r}] uses the locmem backend with DEBUG = False.",
                    hint="locmem locks exclude only threads of one process; use the "
                    "database or Redis backend in production.",
                    obj="settings.LOCKS",
                    id="distlock.W002",
                )
            ]
        return []

    def acquire(self, name, ttl, timeout, kind=EXCLUSIVE):
        if kind is not EXCLUSIVE and kind.mode != "exclusive":
            if kind.mode == "shared":
                return self._acquire_shared(name, ttl, timeout)
            return self._acquire_permit(name, ttl, timeout, kind)
        table = self._table
        host, pid, thread = holder_identity()
        token = new_token()
        with table.cond:
            # The free lock first, outside the waiting loop's bookkeeping.
            now = time.monotonic()
            if table.live(name, now) is None and not (
                table.readers and table.live_readers(name, now)
            ):
                fence = table.next_fence()
                table.entries[name] = _Entry(
                    token, fence, now + ttl, host, pid, thread, time.time()
                )
                return Lease(self.alias, name, token, fence, ttl, now + ttl)
            if timeout == 0:
                return None
            deadline = math.inf if timeout is None else now + timeout
            queued = False
            try:
                while True:
                    now = time.monotonic()
                    current = table.live(name, now)
                    readers = table.readers and table.live_readers(name, now)
                    if current is None and not readers:
                        fence = table.next_fence()
                        table.entries[name] = _Entry(
                            token, fence, now + ttl, host, pid, thread, time.time()
                        )
                        return Lease(self.alias, name, token, fence, ttl, now + ttl)
                    if now >= deadline:
                        return None
                    if not queued:
                        queued = True
                        waiting = table.writers_waiting
                        waiting[name] = waiting.get(name, 0) + 1
                    expiry = (
                        current.expires if current else _first_expiry(readers.values())
                    )
                    table.cond.wait(min(deadline, expiry) - now)
            finally:
                if queued:
                    self._unqueue_writer(name)

    def _unqueue_writer(self, name: str) -> None:
        waiting = self._table.writers_waiting
        waiting[name] -= 1
        if not waiting[name]:
            del waiting[name]
            # Shared requests queued behind this writer may go now.
            self._table.cond.notify_all()

    def _acquire_shared(self, name, ttl, timeout):
        table = self._table
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        host, pid, thread = holder_identity()
        token = new_token()
        with table.cond:
            while True:
                now = time.monotonic()
                current = table.live(name, now)
                if current is None and name not in table.writers_waiting:
                    readers = table.readers.setdefault(name, {})
                    readers[token] = _Entry(
                        token,
                        table.last_fence,
                        now + ttl,
                        host,
                        pid,
                        thread,
                        time.time(),
                    )
                    return Lease(
                        self.alias,
                        name,
                        token,
                        table.last_fence,
                        ttl,
                        now + ttl,
                        kind=SHARED,
                    )
                if now >= deadline:
                    return None
                # Behind a queued writer: woken when it leaves the queue.
                expiry = current.expires if current is not None else math.inf
                wait = min(deadline, expiry) - now
                table.cond.wait(None if math.isinf(wait) else wait)

    def _acquire_permit(self, name, ttl, timeout, kind):
        table = self._table
        limit = kind.limit
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        host, pid, thread = holder_identity()
        token = new_token()
        ticket = None
        with table.cond:
            try:
                while True:
                    now = time.monotonic()
                    semaphore = table.live_semaphore(name, now)
                    if semaphore is None:
                        semaphore = table.semaphores[name] = _Semaphore(limit)
                    elif not semaphore.holders:
                        semaphore.limit = limit
                    elif semaphore.limit != limit:
                        raise limit_mismatch(name, semaphore.limit, limit)
                    first = not semaphore.queue or semaphore.queue[0] is ticket
                    if first and len(semaphore.holders) < limit:
                        if ticket is not None:
                            semaphore.queue.popleft()
                            ticket = None
                            # The next waiter may fit too.
                            table.cond.notify_all()
                        fence = table.next_fence()
                        semaphore.holders[token] = _Entry(
                            token, fence, now + ttl, host, pid, thread, time.time()
                        )
                        return Lease(
                            self.alias, name, token, fence, ttl, now + ttl, kind=kind
                        )
                    if now >= deadline:
                        return None
                    if ticket is None:
                        ticket = object()
                        semaphore.queue.append(ticket)
                    expiry = _first_expiry(semaphore.holders.values())
                    wait = min(deadline, expiry) - now
                    table.cond.wait(None if math.isinf(wait) else wait)
            finally:
                if ticket is not None:
                    semaphore = table.semaphores.get(name)
                    if semaphore is not None and ticket in semaphore.queue:
                        semaphore.queue.remove(ticket)
                        table.cond.notify_all()

    def _mine(self, lease) -> _Entry | None:
        table, now = self._table, time.monotonic()
        mode = lease.kind.mode
        if mode == "exclusive":
            entry = table.live(lease.name, now)
            return entry if entry is not None and entry.token == lease.token else None
        if mode == "shared":
            return table.live_readers(lease.name, now).get(lease.token)
        semaphore = table.live_semaphore(lease.name, now)
        return semaphore.holders.get(lease.token) if semaphore else None

    def _remove(self, name, token, mode) -> None:
        table = self._table
        if mode == "exclusive":
            del table.entries[name]
        elif mode == "shared":
            del table.readers[name][token]
        else:
            del table.semaphores[name].holders[token]
        table.cond.notify_all()

    def release(self, lease):
        table = self._table
        with table.cond:
            if lease.kind is EXCLUSIVE:  # the common case, inline
                entry = table.live(lease.name, time.monotonic())
                if entry is None or entry.token != lease.token:
                    return False
                del table.entries[lease.name]
                table.cond.notify_all()
                return True
            if self._mine(lease) is None:
                return False
            self._remove(lease.name, lease.token, lease.kind.mode)
            return True

    def extend(self, lease, ttl):
        with self._table.cond:
            entry = self._mine(lease)
            if entry is None:
                return False
            now = time.monotonic()
            entry.expires = lease.deadline = now + ttl
            return True

    def is_held(self, lease):
        with self._table.cond:
            return self._mine(lease) is not None

    # In-memory and non-blocking: the async twins run inline (no thread hop),
    # except aacquire, which may wait (the base class runs it in a thread).

    async def arelease(self, lease):
        return self.release(lease)

    async def aextend(self, lease, ttl):
        return self.extend(lease, ttl)

    async def ais_held(self, lease):
        return self.is_held(lease)

    async def arenew(self, leases):
        return self.renew(leases)

    async def aholder_of(self, name, kind=EXCLUSIVE):
        return self.holder_of(name, kind)

    def _listed(self, now_mono: float, prefix: str = "", name: str | None = None):
        """Return ``(name, entry, kind)`` of the live holders (under the lock)."""
        table = self._table
        found = []

        def wanted(n: str) -> bool:
            return n == name if name is not None else n.startswith(prefix)

        for n, e in table.entries.items():
            if e.expires > now_mono and wanted(n):
                found.append((n, e, EXCLUSIVE))
        for n, readers in table.readers.items():
            if wanted(n):
                found += [
                    (n, e, SHARED) for e in readers.values() if e.expires > now_mono
                ]
        for n, semaphore in table.semaphores.items():
            if wanted(n):
                kind = permit(semaphore.limit)
                found += [
                    (n, e, kind)
                    for e in semaphore.holders.values()
                    if e.expires > now_mono
                ]
        return found

    def holders(self, prefix=""):
        now_mono, now = time.monotonic(), time.time()
        with self._table.cond:
            items = self._listed(now_mono, prefix)
        for name, e, kind in items:
            yield self._holder(name, e, now_mono, now, kind)

    def holder_of(self, name, kind=EXCLUSIVE):
        now_mono, now = time.monotonic(), time.time()
        with self._table.cond:
            items = self._listed(now_mono, name=name)
        semaphore = kind.mode == "permit"
        busy = [
            (e, k)
            for _, e, k in items
            if (k.mode == "permit") == semaphore
            and not (kind.mode == "shared" and k.mode == "shared")
        ]
        if not busy:
            return None
        entry, found = min(busy, key=lambda item: item[0].expires)
        return self._holder(name, entry, now_mono, now, found)

    def _holder(self, name, e, now_mono, now, kind=EXCLUSIVE):
        return Holder(
            backend=self.alias,
            name=name,
            token=e.token,
            host=e.host,
            pid=e.pid,
            thread=e.thread,
            acquired_at=datetime.fromtimestamp(e.acquired_at, timezone.utc),
            expires_at=datetime.fromtimestamp(now, timezone.utc)
            + timedelta(seconds=e.expires - now_mono),
            fencing_token=e.fence,
            kind=kind,
        )

    def force_release(self, name, token, kind=EXCLUSIVE):
        lease = Lease(self.alias, name, token, 0, 0.0, 0.0, kind=kind)
        with self._table.cond:
            if self._mine(lease) is None:
                return False
            self._remove(name, token, kind.mode)
            return True

    def clear_stale(self):
        now = time.monotonic()
        table = self._table
        with table.cond:
            stale = [n for n, e in table.entries.items() if e.expires <= now]
            for n in stale:
                del table.entries[n]
            removed = len(stale)
            for name in list(table.readers):
                before = len(table.readers[name])
                removed += before - len(table.live_readers(name, now))
            for name in list(table.semaphores):
                before = len(table.semaphores[name].holders)
                semaphore = table.live_semaphore(name, now)
                removed += before - (len(semaphore.holders) if semaphore else 0)
            return removed

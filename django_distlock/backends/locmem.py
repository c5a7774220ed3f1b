"""In-process backend for development and tests: threads of one process.

Like Django's locmem cache, each process has its own locks, so it gives no
mutual exclusion between processes; a system check warns when it is used
with ``DEBUG = False``.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from django.conf import settings
from django.core.checks import Warning

from .base import BaseLockBackend, Holder, Lease, holder_identity, new_token

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


class _Table:
    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.entries: dict[str, _Entry] = {}
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


class LocMemLockBackend(BaseLockBackend):
    """Locks held in this process's memory (``LOCATION`` names a separate table)."""

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

    def acquire(self, name, ttl, timeout):
        table = self._table
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        host, pid, thread = holder_identity()
        token = new_token()
        with table.cond:
            while True:
                now = time.monotonic()
                current = table.live(name, now)
                if current is None:
                    fence = table.next_fence()
                    table.entries[name] = _Entry(
                        token, fence, now + ttl, host, pid, thread, time.time()
                    )
                    return Lease(self.alias, name, token, fence, ttl, now + ttl)
                if now >= deadline:
                    return None
                table.cond.wait(min(deadline, current.expires) - now)

    def _mine(self, lease) -> _Entry | None:
        entry = self._table.live(lease.name, time.monotonic())
        return entry if entry is not None and entry.token == lease.token else None

    def release(self, lease):
        with self._table.cond:
            if self._mine(lease) is None:
                return False
            del self._table.entries[lease.name]
            self._table.cond.notify_all()
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

    def holders(self, prefix=""):
        now_mono, now = time.monotonic(), time.time()
        with self._table.cond:
            items = [
                (n, e)
                for n, e in self._table.entries.items()
                if e.expires > now_mono and n.startswith(prefix)
            ]
        for name, e in items:
            yield self._holder(name, e, now_mono, now)

    def holder_of(self, name):
        now_mono, now = time.monotonic(), time.time()
        with self._table.cond:
            entry = self._table.live(name, now_mono)
        if entry is None:
            return None
        return self._holder(name, entry, now_mono, now)

    def _holder(self, name, e, now_mono, now):
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
        )

    def force_release(self, name, token):
        with self._table.cond:
            entry = self._table.live(name, time.monotonic())
            if entry is None or entry.token != token:
                return False
            del self._table.entries[name]
            self._table.cond.notify_all()
            return True

    def clear_stale(self):
        now = time.monotonic()
        with self._table.cond:
            stale = [n for n, e in self._table.entries.items() if e.expires <= now]
            for n in stale:
                del self._table.entries[n]
            return len(stale)

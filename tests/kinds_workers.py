"""Workers for cross-process tests of shared locks and semaphores.

Run through :mod:`tests.procs` (spawned processes with the parent's settings,
test databases and ``LOCKS``); they call the backend of ``LOCKS["default"]``
directly. Times are :func:`time.monotonic` (system-wide on Linux, so they
compare across processes).
"""

from __future__ import annotations

import os
import time

from .workers import write_whole


def _backend():
    from django_distlock import locks

    return locks["default"]


def readers_writers(
    name: str, writer: bool, start_at: float, iterations: int, hold: float
) -> list[tuple[float, float, int, bool]]:
    """Take ``name`` shared (or exclusive if ``writer``) ``iterations`` times.

    Start at ``start_at``; hold each lease ``hold`` seconds. Return
    ``(start, end, pid, writer)`` of every critical section.
    """
    from django_distlock.backends.kinds import SHARED

    backend = _backend()
    time.sleep(max(0.0, start_at - time.monotonic()))
    intervals = []
    for _ in range(iterations):
        if writer:
            lease = backend.acquire(name, 10.0, 60.0)
        else:
            lease = backend.acquire(name, 10.0, 60.0, SHARED)
        assert lease is not None, "not acquired within 60 s"
        start = time.monotonic()
        time.sleep(hold)
        end = time.monotonic()
        assert backend.release(lease)
        intervals.append((start, end, os.getpid(), writer))
        time.sleep(hold / 2)
    return intervals


def permits(
    name: str, limit: int, start_at: float, iterations: int, hold: float
) -> list[tuple[float, float, int]]:
    """Take a permit of semaphore ``name`` ``iterations`` times, from ``start_at``.

    Return ``(start, end, pid)`` of every time inside.
    """
    from django_distlock.backends.kinds import permit

    backend = _backend()
    time.sleep(max(0.0, start_at - time.monotonic()))
    intervals = []
    for _ in range(iterations):
        lease = backend.acquire(name, 10.0, 60.0, permit(limit))
        assert lease is not None, "no permit within 60 s"
        start = time.monotonic()
        time.sleep(hold)
        end = time.monotonic()
        assert backend.release(lease)
        intervals.append((start, end, os.getpid()))
    return intervals


def hold_permit(name: str, limit: int, ttl: float, ready_path: str) -> None:
    """Take a permit for ``ttl`` seconds, never renewed, and wait to be killed."""
    from django_distlock.backends.kinds import permit

    lease = _backend().acquire(name, ttl, 30.0, permit(limit))
    assert lease is not None
    write_whole(ready_path, str(lease.fencing_token))
    time.sleep(600)


def wait_exclusive(name: str, ready_path: str) -> None:
    """Wait for ``name`` exclusively (queued behind its shared holders)."""
    write_whole(ready_path, "waiting")
    _backend().acquire(name, 30.0, 600.0)
    time.sleep(600)

"""Worker functions for the cross-process shared-lock and semaphore tests.

Run through :mod:`tests.procs` (spawned processes with the parent's LOCKS).
They call the backend directly (``backend.acquire(name, ttl, timeout, kind)``)
and return their critical sections as ``(start, end, pid, mode)`` in
:func:`time.monotonic` time, which is system-wide on Linux.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from .procs import barrier


def kind_worker(
    name: str,
    mode: str,
    limit: int | None,
    iterations: int,
    hold: float,
    barrier_dir: str,
    parties: int,
) -> list[tuple[float, float, int, str]]:
    """Take ``name`` ``iterations`` times as ``mode`` and hold it ``hold`` s.

    ``mode`` is "shared", "exclusive" or "permit" (of ``limit``). Return the
    critical sections.
    """
    from django_distlock import locks
    from django_distlock.backends.base import EXCLUSIVE, SHARED, permit

    backend = locks["default"]
    kind = {"shared": SHARED, "exclusive": EXCLUSIVE}.get(mode) or permit(limit)
    barrier(barrier_dir, parties)
    intervals = []
    for _ in range(iterations):
        lease = backend.acquire(name, 30.0, 60.0, kind)
        assert lease is not None, f"{mode} not acquired within 60 s"
        start = time.monotonic()
        time.sleep(hold)
        end = time.monotonic()
        assert backend.release(lease)
        intervals.append((start, end, os.getpid(), mode))
    return intervals


def hold_permit_forever(name: str, limit: int, ttl: float, ready_path: str) -> None:
    """Take a permit of ``name`` (not renewed), say so in ``ready_path``, and
    sleep until killed."""
    from django_distlock import locks
    from django_distlock.backends.base import permit

    lease = locks["default"].acquire(name, ttl, 30.0, permit(limit))
    assert lease is not None
    partial = Path(ready_path + ".partial")
    partial.write_text(lease.token)
    os.replace(partial, ready_path)
    while True:
        time.sleep(1)


def wait_permit(name: str, limit: int, ttl: float) -> None:
    """Wait for a permit of ``name`` (a semaphore of ``limit``) until killed."""
    from django_distlock import locks
    from django_distlock.backends.base import permit

    locks["default"].acquire(name, ttl, 600.0, permit(limit))
    while True:
        time.sleep(1)


def take_woken_permit(name: str, limit: int, done_path: str) -> None:
    """Wait for a permit of ``name`` and write ``done_path`` once it has one.

    The waits between two attempts last a minute here, so a waiter that has
    its permit within seconds of the release was woken by it.
    """
    from django_distlock import locks
    from django_distlock.backends.base import permit
    from django_distlock.backends.database import waiting

    waiting.NOTIFY_SAFETY_WAIT = 60.0
    lease = locks["default"].acquire(name, 60.0, 120.0, permit(limit))
    Path(done_path).write_text("held" if lease else "timed out")


def wait_exclusive(name: str, ready_path: str) -> None:
    """Say so in ``ready_path``, then wait for ``name`` exclusively (behind
    its shared holders) until killed."""
    from django_distlock import locks

    Path(ready_path).touch()
    locks["default"].acquire(name, 30.0, 600.0)
    while True:
        time.sleep(1)


def hold_kind(
    name: str, mode: str, limit: int, rounds: int, hold: float, start_at: float
) -> list[tuple[float, float, str]]:
    """Take ``name`` ``rounds`` times as ``mode``; return the held intervals.

    ``mode`` is "shared", "exclusive" or "permit" (a semaphore of ``limit``).
    Intervals are (start, end) on the system-wide monotonic clock, taken
    inside the held section, so two processes' intervals compare.
    """
    from django_distlock import lock, semaphore

    while time.monotonic() < start_at:
        time.sleep(0.001)
    intervals = []
    for _ in range(rounds):
        if mode == "permit":
            handle = semaphore(name, limit, timeout=60)
        else:
            handle = lock(name, shared=mode == "shared", timeout=60)
        with handle:
            start = time.monotonic()
            time.sleep(hold)
            intervals.append((start, time.monotonic(), mode))
    return intervals


def first_holders(names: list[str], mode: str, start_at: float) -> list[str]:
    """Take and release ``mode`` of each of ``names``, each name's first
    attempt at the same instant in every process (``start_at`` + 0.2 s per
    name); return the errors met."""
    from django_distlock import locks
    from django_distlock.backends.base import EXCLUSIVE, SHARED, permit

    backend = locks["default"]
    kind = {"exclusive": EXCLUSIVE, "shared": SHARED}.get(mode) or permit(8)
    errors = []
    for i, lock_name in enumerate(names):
        while time.monotonic() < start_at + 0.2 * i:
            time.sleep(0.0005)
        try:
            lease = backend.acquire(lock_name, 10, 10, kind)
            if lease is not None:
                backend.release(lease)
        except Exception as e:  # noqa: BLE001 - reported to the test
            errors.append(repr(e))
    return errors

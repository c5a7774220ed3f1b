"""Worker functions for the cross-process tests of shared locks and permits.

Module-level so that spawned processes (:mod:`tests.procs`) import them by
name. They talk to the backend directly (``locks[using].acquire(..., kind)``),
so they prove the backend's own exclusion whatever the lock handle does.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from .procs import barrier


def kind_of(mode: str, limit: int | None):
    """Return the Kind for ``mode`` ("exclusive", "shared" or "permit")."""
    from django_distlock.backends.kinds import EXCLUSIVE, SHARED, permit

    if mode == "permit":
        return permit(limit)
    return SHARED if mode == "shared" else EXCLUSIVE


def hold_repeatedly(
    name: str,
    mode: str,
    limit: int | None,
    iterations: int,
    hold: float,
    barrier_dir: str,
    parties: int,
    using: str = "default",
) -> list[tuple[float, float, int, str]]:
    """Take ``name`` as ``mode`` ``iterations`` times, holding ``hold`` s each.

    Return ``(start, end, pid, mode)`` of every hold, in :func:`time.monotonic`
    time (system-wide on Linux, so comparable across processes); each is
    measured inside the hold, after the grant and before the release.
    """
    from django_distlock import locks

    backend = locks[using]
    kind = kind_of(mode, limit)
    barrier(barrier_dir, parties)
    intervals = []
    for _ in range(iterations):
        lease = backend.acquire(name, 30.0, 120.0, kind)
        if lease is None:
            raise RuntimeError(f"{mode} of {name!r} not granted within 120 s")
        start = time.monotonic()
        time.sleep(hold)
        end = time.monotonic()
        if not backend.release(lease):
            raise RuntimeError(f"{mode} of {name!r} was lost while held")
        intervals.append((start, end, os.getpid(), mode))
    return intervals


def hold_kind(
    name: str,
    mode: str,
    limit: int | None,
    ttl: float,
    ready_path: str,
    seconds: float,
    using: str = "default",
) -> None:
    """Take ``name`` as ``mode`` and sit on it for ``seconds`` (to be killed).

    Write the lease's fencing token to ``ready_path`` once it is held.
    """
    from django_distlock import locks

    lease = locks[using].acquire(name, ttl, 30.0, kind_of(mode, limit))
    if lease is None:
        raise RuntimeError(f"{mode} of {name!r} not granted")
    partial = Path(ready_path + ".partial")
    partial.write_text(str(lease.fencing_token))
    os.replace(partial, ready_path)
    time.sleep(seconds)

"""Worker functions for cross-process tests (run through :mod:`tests.procs`).

They must live at module level in an importable module: the worker
processes are spawned and import them by name. Each sets nothing up itself;
:func:`tests.procs.run_in_processes` has already configured Django with the
parent's settings, test database names and ``LOCKS``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def counter_worker(
    name: str, path: str, iterations: int, ttl: float, using: str = "default"
) -> list[tuple[float, float, int]]:
    """Increment the counter in file ``path`` ``iterations`` times under the lock.

    The increment is a deliberately non-atomic read-modify-write with a
    pause in between, so any two overlapping critical sections lose an
    update. Return ``(start, end, pid)`` of every critical section, in
    :func:`time.monotonic` time (system-wide on Linux, so comparable across
    processes).
    """
    from django_distlock import lock

    counter = Path(path)
    intervals = []
    for _ in range(iterations):
        with lock(name, ttl=ttl, timeout=60, using=using):
            start = time.monotonic()
            value = int(counter.read_text() or "0")
            time.sleep(0.001)
            counter.write_text(str(value + 1))
            end = time.monotonic()
        intervals.append((start, end, os.getpid()))
    return intervals


def try_acquire(
    name: str, timeout: float, ttl: float = 5.0, using: str = "default"
) -> int | None:
    """Try to take ``name`` within ``timeout``; return its fencing token or None.

    A lock taken is released before returning.
    """
    from django_distlock import lock

    held = lock(name, ttl=ttl, timeout=timeout, auto_renew=False, using=using)
    if not held.acquire():
        return None
    token = held.fencing_token
    held.release()
    return token


def write_whole(path: str, text: str) -> None:
    """Write ``text`` aside, then rename it to ``path``: a reader polling
    for the file never sees it empty or half written."""
    partial = Path(path + ".partial")
    partial.write_text(text)
    os.replace(partial, path)


def hold_for(
    name: str, seconds: float, ready_path: str, ttl: float = 5.0, using: str = "default"
) -> int:
    """Hold ``name`` for ``seconds``, touching ``ready_path`` once it is held.

    Return the fencing token it held.
    """
    from django_distlock import lock

    with lock(name, ttl=ttl, timeout=30, using=using) as held:
        write_whole(ready_path, str(held.fencing_token))
        time.sleep(seconds)
        return held.fencing_token


def clear_lock(name: str, using: str = "default") -> None:
    """Force-release ``name`` as an operator does: ``manage.py locks clear``."""
    from django.core.management import call_command

    call_command("locks", "clear", name, "--noinput", "--using", using)

"""Run test workers in real, separate processes (spawned, not forked).

Each worker process sets Django up from scratch with the parent's settings
module, the database names the test run uses and the LOCKS in force, so
cross-process tests exercise exactly what a second server process would.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import connections


def _django_state() -> dict[str, Any]:
    return {
        "settings_module": os.environ.get("DJANGO_SETTINGS_MODULE", "tests.settings"),
        "db_names": {
            alias: connections[alias].settings_dict["NAME"]
            for alias in settings.DATABASES
        },
        "locks": getattr(settings, "LOCKS", None),
        # pytest-django runs tests with DEBUG off; so do the workers (with
        # it on, Django keeps every query and its parameters in memory: the
        # torture workers' growing records came to about 1 GB a worker).
        "debug": settings.DEBUG,
    }


def _init_worker(state: dict[str, Any]) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = state["settings_module"]
    import django
    from django.conf import settings as s

    django.setup()
    s.DEBUG = state["debug"]
    for alias, name in state["db_names"].items():
        s.DATABASES[alias]["NAME"] = name
        connections[alias].settings_dict["NAME"] = name
    if state["locks"] is not None:
        s.LOCKS = state["locks"]
        from django_distlock.handler import locks

        locks.reset()


def _call(state, func, args):
    _init_worker(state)
    return func(*args)


def run_in_processes(func: Callable, arg_lists: list[tuple], timeout: float = 120):
    """Run ``func(*args)`` for each args tuple in its own process; return results.

    ``func`` must be importable (a module-level function). Each call gets
    a process of its own, all of them started at once: a pool worker whose
    call ended never takes another call, which a worker still starting up
    would otherwise have run (one pid fewer, calls that never overlapped).
    """
    ctx = multiprocessing.get_context("spawn")
    state = _django_state()
    with ctx.Pool(len(arg_lists), maxtasksperchild=1) as pool:
        pending = [pool.apply_async(_call, (state, func, args)) for args in arg_lists]
        return [p.get(timeout=timeout) for p in pending]


def start_process(func: Callable, *args) -> multiprocessing.Process:
    """Start ``func(*args)`` in one spawned process and return it (not joined)."""
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=_call, args=(_django_state(), func, args), daemon=True)
    proc.start()
    return proc

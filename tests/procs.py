"""Run test workers in real, separate processes.

Each worker process sets Django up from scratch with the parent's settings
module, environment, the database names the test run uses and the LOCKS in
force, so cross-process tests exercise exactly what a second server process
would.

Workers start through multiprocessing's forkserver, never by forking the
test process: a server process, itself started fresh, imports the heavy
libraries once (:data:`PRELOAD`), and each worker is a fork of it. A worker
thus shares nothing with the test process, as a spawned one would, and
skips the half second of CPU that importing Django, redis-py and the
database drivers costs a spawned interpreter (the suites start thousands).
"""

from __future__ import annotations

import faulthandler
import functools
import multiprocessing
import multiprocessing.util
import os
import pickle
import queue
import signal
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connections

#: Imported once by the forkserver, before any worker forks from it: only
#: libraries that read no setting at import time (Django's apps and settings
#: are set up by each worker itself).
PRELOAD = [
    "django.db.models",
    "django.test",
    "django.contrib.admin",
    "redis",
    "redis.asyncio",
    "psycopg",
    "pymysql",
    "kazoo.client",
]


@functools.cache
def context() -> multiprocessing.context.BaseContext:
    """Return the multiprocessing context that starts every worker process."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def _django_state() -> dict[str, Any]:
    return {
        # The forkserver kept the environment of its start: a worker gets the
        # test's environment of now, as a spawned one would.
        "environ": dict(os.environ),
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
    os.environ.clear()
    os.environ.update(state["environ"])
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


def stacks_path(pid: int) -> str:
    """Return where worker ``pid`` writes its threads' stacks on SIGUSR1."""
    return os.path.join(tempfile.gettempdir(), f"distlock-stacks-{pid}.txt")


def dump_stacks(pid: int, wait: float = 1.0) -> str:
    """Return the stacks of worker ``pid``'s threads (to tell where it hangs)."""
    try:
        os.kill(pid, signal.SIGUSR1)
    except OSError as e:
        return f"no stacks of {pid}: {e}"
    time.sleep(wait)
    try:
        with open(stacks_path(pid)) as f:
            return f.read()
    except OSError as e:
        return f"no stacks of {pid}: {e}"


def dump_stacks_on_signal() -> None:
    """Write this process's threads' stacks for :func:`dump_stacks` on SIGUSR1.

    The file goes when the process ends normally.
    """
    path = stacks_path(os.getpid())
    # Kept open for the process's life: faulthandler writes to its descriptor.
    stacks = open(path, "w")  # noqa: SIM115
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    # Run by multiprocessing at a worker's exit (which skips atexit).
    multiprocessing.util.Finalize(None, os.unlink, args=(path,), exitpriority=0)


def _call(state, func, args):
    _init_worker(state)
    return func(*args)


def _report(results, index: int, state, func, args) -> None:
    """Run one call in this process and put ``(index, ok, value)`` on ``results``."""
    try:
        value = (index, True, _call(state, func, args))
    except BaseException as e:  # noqa: BLE001 - handed to the parent
        remote = traceback.format_exc()
        try:
            pickle.dumps(e)
        except Exception:  # noqa: BLE001 - an exception that does not pickle
            e = RuntimeError(repr(e))
        value = (index, False, (e, remote))
    results.put(value)
    results.close()
    results.join_thread()


def run_in_processes(func: Callable, arg_lists: list[tuple], timeout: float = 120):
    """Run ``func(*args)`` for each args tuple in its own process; return results.

    ``func`` must be importable (a module-level function). The processes
    start together and each runs exactly one call (a pool would let a worker
    whose call ended take the call of one still starting up). A call that
    raised re-raises here, its traceback in the message; a process that died
    without answering, or ``timeout`` seconds in all, fail the test.
    """
    ctx = context()
    state = _django_state()
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_report, args=(results, i, state, func, args), daemon=True)
        for i, args in enumerate(arg_lists)
    ]
    for proc in procs:
        proc.start()
    answers: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(answers) < len(procs):
            # A process flushes its answer before it exits: one found dead
            # before an empty read never answered.
            dead = [
                p.pid
                for i, p in enumerate(procs)
                if i not in answers and p.exitcode is not None
            ]
            try:
                index, ok, value = results.get(timeout=0.2)
            except queue.Empty:
                if dead:
                    raise RuntimeError(
                        f"worker process(es) {dead} died without an answer"
                    ) from None
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"workers still running after {timeout} s"
                    ) from None
                continue
            if not ok:
                error, remote = value
                raise error from RuntimeError(f"in a worker process:\n{remote}")
            answers[index] = value
    finally:
        # All answered: they are exiting. Else the test failed: stop the rest.
        for proc in procs:
            proc.join(5 if len(answers) == len(procs) else 0)
            if proc.is_alive():
                proc.kill()
                proc.join()
        results.close()
    return [answers[i] for i in range(len(procs))]


def start_process(func: Callable, *args) -> multiprocessing.Process:
    """Start ``func(*args)`` in a process of its own and return it (not joined)."""
    proc = context().Process(
        target=_call, args=(_django_state(), func, args), daemon=True
    )
    proc.start()
    return proc


def barrier(directory: str, parties: int, timeout: float = 120) -> None:
    """Wait in a worker until ``parties`` workers have reached this point.

    Each worker leaves a file in ``directory`` (one the workers share, used
    for nothing else), so they start their measured part together.
    """
    Path(directory, f"ready-{os.getpid()}").touch()
    deadline = time.monotonic() + timeout
    while len(list(Path(directory).glob("ready-*"))) < parties:
        if time.monotonic() > deadline:
            raise RuntimeError("the other workers never arrived")
        time.sleep(0.01)

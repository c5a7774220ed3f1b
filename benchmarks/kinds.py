"""Shared locks and semaphores (issue 22): their cycle beside the exclusive one.

Uncontended, per backend (Redis, and the database backend on PostgreSQL
and on a SQLite file):
``with lock(name): pass``, ``with lock(name, shared=True): pass`` and
``with semaphore(name, 3): pass`` (auto_renew off, one name each), and the
exclusive cycle of the package as it was before issue 22 (commit
``34e8a02``). The old package is taken out of git into a temporary directory
and imported in a spawned process whose ``sys.path`` starts there; the
current package runs in a spawned process of its own, so both exclusive
cycles pay the same process setup. The parent only drives the rounds
(:func:`~benchmarks.core.alternate`): each runner asks its process for n
cycles and gets their times back, so old and new alternate in one run.

Contended: 8 processes under a limit-3 semaphore against the same processes
under an exclusive lock (:mod:`benchmarks.kinds_contended`).
"""

from __future__ import annotations

import gc
import io
import multiprocessing
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

from . import kinds_contended
from .core import alternate, cycles

EXCL = "exclusive lock()"
EXCL_BEFORE = "exclusive lock(), before issue 22"
SHARED = "lock(shared=True)"
SEM = "semaphore(limit=3)"
CONTENDERS = [EXCL, EXCL_BEFORE, SHARED, SEM]
LIMIT = 3
#: The package before issue 22 (shared locks and semaphores).
BEFORE_COMMIT = "34e8a02"
#: Backend label -> LOCKS alias of benchmarks/settings.py.
BACKENDS = {"Redis": "default", "PostgreSQL": "db", "SQLite": "lite"}
#: The contention figure's third backend (benchmarks/kinds_settings.py).
NOTIFY = 'PostgreSQL, WAIT="notify"'

#: Targets from issue 22: contender -> (reference contender, highest p50 ratio).
TARGETS = {
    EXCL: (EXCL_BEFORE, 1.03),
    SHARED: (EXCL, 1.20),
    SEM: (EXCL, 1.30),
}


def checkout_before(root) -> tuple[str | None, str]:
    """Extract ``django_distlock`` at BEFORE_COMMIT into a temporary directory.

    Return (directory, "") or (None, why not): a shallow clone, or no git,
    leaves the "before" row out instead of failing the run.
    """
    try:
        tar = subprocess.run(
            ["git", "-C", str(root), "archive", BEFORE_COMMIT, "django_distlock"],
            capture_output=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"git archive failed: {e}"
    if tar.returncode != 0:
        message = tar.stderr.decode(errors="replace").strip().splitlines()
        return None, f"commit {BEFORE_COMMIT} not available ({' '.join(message)})"
    where = tempfile.mkdtemp(prefix="distlock-bench-before-")
    with tarfile.open(fileobj=io.BytesIO(tar.stdout)) as archive:
        archive.extractall(where, filter="data")
    return where, ""


def _cycle(lock_or_semaphore, *args, **kwargs):
    def cycle():
        with lock_or_semaphore(*args, auto_renew=False, **kwargs):
            pass

    return cycle


def _worker(old_root: str | None, aliases: list[str], conn) -> None:
    """Serve ``(contender, alias, n)`` requests with n timed cycles each.

    With ``old_root`` the package is imported from there (the exclusive
    cycle only: the old package has no other kind).
    """
    if old_root:
        sys.path.insert(0, old_root)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
    try:
        from .common import quiet_imports

        quiet_imports()
        import django

        django.setup()
        import django_distlock
        from django_distlock import lock

        where = os.path.dirname(django_distlock.__file__)
        if old_root and not where.startswith(old_root):
            raise RuntimeError(f"imported {where}, not the package of {old_root}")
        tag = "before" if old_root else "now"
        runners = {}
        for alias in aliases:
            runners[EXCL, alias] = cycles(_cycle(lock, f"bench:k:x:{tag}", using=alias))
            if not old_root:
                from django_distlock import semaphore

                runners[SHARED, alias] = cycles(
                    _cycle(lock, "bench:k:s", using=alias, shared=True)
                )
                runners[SEM, alias] = cycles(
                    _cycle(semaphore, "bench:k:p", LIMIT, using=alias)
                )
    except Exception as e:
        conn.send((False, f"{type(e).__name__}: {e}"))
        return
    conn.send((True, where))
    try:
        while (request := conn.recv()) is not None:
            kind, alias, n = request
            gc.collect()
            try:
                conn.send((True, runners[kind, alias](n)))
            except Exception as e:
                conn.send((False, f"{type(e).__name__}: {e}"))
    finally:
        from django.db import connections

        connections.close_all()


class Remote:
    """One spawned process running cycles for the parent's rounds."""

    def __init__(self, mp, old_root: str | None, aliases: list[str]) -> None:
        self.conn, child = mp.Pipe()
        self.proc = mp.Process(
            target=_worker, args=(old_root, aliases, child), daemon=True
        )
        self.proc.start()
        child.close()
        self.where = self._reply(180)

    def _reply(self, timeout: float):
        if not self.conn.poll(timeout):
            raise RuntimeError("benchmark process did not answer")
        ok, value = self.conn.recv()
        if not ok:
            raise RuntimeError(value)
        return value

    def runner(self, kind: str, alias: str):
        def run(n: int) -> list[int]:
            self.conn.send((kind, alias, n))
            return self._reply(300)

        return run

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join()


def run(ctx) -> dict:
    """Return {"backends": {label: {"series", "targets", "floor"}}, ...}."""
    backends = {"Redis": BACKENDS["Redis"]}
    notes = []
    if ctx.has_database_backend and ctx.pg is not None:
        backends["PostgreSQL"] = BACKENDS["PostgreSQL"]
    else:
        notes.append("PostgreSQL rows left out: no PostgreSQL in this run")
    if ctx.has_database_backend:
        backends["SQLite"] = BACKENDS["SQLite"]
    aliases = list(backends.values())
    mp = multiprocessing.get_context("spawn")
    old_root, why = checkout_before(ctx.root)
    if old_root is None:
        notes.append(f"the before-issue-22 row is left out: {why}")
    remotes: list[Remote] = []
    result: dict = {"backends": {}, "notes": notes, "before": BEFORE_COMMIT}
    try:
        now = Remote(mp, None, aliases)
        remotes.append(now)
        before = None
        if old_root:
            before = Remote(mp, old_root, aliases)
            remotes.append(before)
        ctx.progress(f"cycle processes ready (before: {before and before.where})")
        for label, alias in backends.items():
            runners = {EXCL: now.runner(EXCL, alias)}
            if before is not None:
                runners[EXCL_BEFORE] = before.runner(EXCL, alias)
            runners[SHARED] = now.runner(SHARED, alias)
            runners[SEM] = now.runner(SEM, alias)
            ctx.current = f"kinds {label}"
            series = alternate(
                runners,
                rounds=ctx.size(full=20, quick=3),
                per_round=ctx.size(full=200, quick=30),
                warmup=ctx.size(full=100, quick=10),
                progress=ctx.progress,
            )
            result["backends"][label] = {
                "series": series,
                "targets": TARGETS,
                "floor": EXCL,
            }
    finally:
        for remote in remotes:
            remote.stop()
        if old_root:
            shutil.rmtree(old_root, ignore_errors=True)
    ctx.current = "kinds contended"
    if "PostgreSQL" in backends:
        # Polling (the default) and waking on NOTIFY, with the same processes.
        backends[NOTIFY] = "db-notify"
    result["contended"] = kinds_contended.run(ctx, backends)
    ctx.current = "kinds"
    return result

"""Worker processes of the torture scenarios for shared locks and semaphores.

Like :mod:`tests.torture.workers`, a worker loops until its stop file
appears, taking a lock and logging every attempt and critical section (see
:mod:`tests.torture.history`); here each acquisition is of a kind: a writer
(exclusive) or a reader (shared) of a readers-writer lock, or one permit of a
semaphore. Readers write no record (``save(fence=)`` refuses a shared
holder), so the oracle is the intervals alone (:mod:`.test_kinds`).

The backend is driven directly (``backend.acquire(name, ttl, timeout,
kind)``, ``backend.release(lease)``), as the kinds tests do until the lock
handle for kinds lands; the release is reported as the handle reports it: a
lease already marked lost, or a release that finds it gone, is ``LockLost``.
Sections are short next to the TTL, so no lease needs renewing.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

from .history import EventLog
from .workers import use_databases


def _kind(mode: str, limit: int | None):
    from django_distlock.backends.kinds import EXCLUSIVE, SHARED, permit

    if mode == "permit":
        return permit(limit)
    return SHARED if mode == "shared" else EXCLUSIVE


def kinds_worker(cfg: dict) -> None:
    """Take kinds of locks until ``cfg["stop"]`` exists.

    ``cfg["limit"]`` set: every acquisition is a permit of that semaphore;
    otherwise a writer with probability ``cfg["writers"]``, else a reader.
    """
    from django_distlock import locks
    from django_distlock.exceptions import LockError, LockLost

    backend = locks[cfg["alias"]]
    wid = cfg["wid"]
    log = EventLog(Path(cfg["log_dir"]) / f"{wid}.jsonl")
    rng = random.Random(cfg.get("seed", 0) * 1000 + 7)
    stop = Path(cfg["stop"])
    limit = cfg.get("limit")
    log.log(k="ready", w=wid, pid=os.getpid(), t=time.monotonic())
    n = 0
    while not stop.exists():
        name = rng.choice(cfg["names"])
        if limit is not None:
            mode = "permit"
        else:
            mode = "exclusive" if rng.random() < cfg["writers"] else "shared"
        t0 = time.monotonic()
        try:
            lease = backend.acquire(
                name, cfg["ttl"], cfg["timeout"], _kind(mode, limit)
            )
        except LockError as e:
            log.log(
                k="attempt",
                w=wid,
                mode=mode,
                t0=t0,
                t1=time.monotonic(),
                ok=False,
                err=type(e).__name__,
            )
            time.sleep(0.05)
            continue
        except Exception as e:  # surfaced to the checker as a contract error
            log.log(
                k="attempt",
                w=wid,
                mode=mode,
                t0=t0,
                t1=time.monotonic(),
                ok=False,
                err=f"unexpected:{type(e).__name__}:{e}"[:300],
            )
            time.sleep(0.05)
            continue
        ok = lease is not None
        log.log(
            k="attempt", w=wid, mode=mode, t0=t0, t1=time.monotonic(), ok=ok, err=None
        )
        if not ok:
            continue
        n += 1
        start = time.monotonic()
        token = lease.fencing_token
        time.sleep(cfg["hold"] * rng.random() * 2)
        end = time.monotonic()
        if lease.lost:
            rel = "LockLost"  # as the handle does: learned of the loss, no release
        else:
            try:
                rel = "ok" if backend.release(lease) else "LockLost"
            except LockLost:
                rel = "LockLost"
            except Exception as e:
                rel = type(e).__name__
        log.log(
            k="cs",
            w=wid,
            id=f"{wid}.{n}",
            name=name,
            mode=mode,
            limit=limit,
            inv=t0,
            start=start,
            end=end,
            done=time.monotonic(),
            token=token,
            write={},
            rel=rel,
        )
        if cfg.get("pause"):
            time.sleep(cfg["pause"] * rng.random())


def kinds_servant(jobs, done) -> None:
    """Run kinds jobs from ``jobs`` one after another; report each on ``done``.

    The kinds twin of :func:`tests.torture.workers.servant` (a pool of
    long-lived processes, each job bringing its scenario's LOCKS).
    """
    from django.conf import settings
    from django.db import connections

    from django_distlock.handler import locks

    while True:
        cfg = jobs.get()
        if cfg is None:
            return
        use_databases(cfg["databases"])
        settings.LOCKS = cfg["locks"]
        locks.reset()
        try:
            kinds_worker(cfg)
            done.put((cfg["wid"], "ok"))
        except BaseException as e:  # reported to the test
            done.put((cfg["wid"], f"{type(e).__name__}: {e}"))
        finally:
            locks.reset()
            for conn in connections.all():
                conn.close()

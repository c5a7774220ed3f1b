"""8 processes under a limit-3 semaphore vs under an exclusive lock, 1 ms held.

The same spawned processes (started once, every kind and backend warmed up
before the first round) loop ``acquire; sleep 1 ms; release`` on one name for
a fixed window, the exclusive lock and the semaphore alternating in rounds,
like :mod:`benchmarks.contended`. Each worker logs, on the machine-wide
monotonic clock, when it asked, when it got the lock or permit and when it
let go.

Handoff, as in the contended scenario, is the time from a holder calling
release to the next holder returning from acquire. With ``limit`` permits,
the i-th acquisition (in time order) needs ``i - limit + 1`` releases before
it, so the release that made room for it is the ``(i - limit)``-th one (in
time order; for a lock, the previous holder's). Only acquisitions that were
already waiting at that release count as handoffs. Safety: an acquisition
that finds ``limit`` others holding (recorded intervals lie inside the real
ones, so any overlap counted is real) is an over-limit grant; there must be
none.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from dataclasses import dataclass, field

from .core import pct, stop_workers

WORKERS = 8
LIMIT = 3
HOLD_S = 0.001
EXCLUSIVE = "exclusive lock()"
SEMAPHORE = f"semaphore(limit={LIMIT})"
KINDS = [EXCLUSIVE, SEMAPHORE]
TTL = 30
#: Targets from issue 22 (semaphore vs exclusive, same processes).
RATIO_TARGET = 2.5
HANDOFF_P99_TARGET_MS = 1.0


def _handle(kind: str, name: str, alias: str):
    from django_distlock import lock, semaphore

    if kind == EXCLUSIVE:
        return lock(name, using=alias, ttl=TTL, timeout=30)
    return semaphore(name, LIMIT, using=alias, ttl=TTL, timeout=30)


def _worker(index: int, aliases: list[str], tasks, results) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.kinds_settings"
    from .common import quiet_imports

    quiet_imports()
    import django

    django.setup()
    try:
        # Connect and load scripts for every kind before reporting ready,
        # on names of this worker's own: the first round must not pay it.
        for alias in aliases:
            for kind in KINDS:
                for _ in range(3):
                    held = _handle(kind, f"bench:kc:warm:{index}", alias)
                    if not held.acquire():
                        raise RuntimeError("warm-up lock busy")
                    held.release()
    except Exception as e:
        results.put((index, None, f"{type(e).__name__}: {e}"))
        return
    results.put((index, None, None))  # ready
    clock = time.monotonic_ns
    while (task := tasks.get()) is not None:
        kind, alias, name, start_at, stop_at = task
        log = []
        try:
            while clock() < start_at:
                time.sleep(0.0005)
            while clock() < stop_at:
                held = _handle(kind, name, alias)
                t_req = clock()
                if not held.acquire():
                    raise RuntimeError(f"{name}: not acquired within 30 s")
                t_acq = clock()
                time.sleep(HOLD_S)
                t_rel = clock()
                held.release()
                log.append((t_req, t_acq, t_rel))
            results.put((index, log, None))
        except Exception as e:  # reported by the parent
            results.put((index, [], f"{type(e).__name__}: {e}"))
    from django.db import connections

    connections.close_all()


@dataclass
class Outcome:
    kind: str
    window_s: float
    cycles: int
    cycles_per_s: float
    handoffs: int
    gaps_ms: list[float]
    waits_ms: list[float]
    per_worker: list[int]
    over_limit: int
    max_holders: int
    round_cycles_per_s: list[float] = field(default_factory=list)
    round_gap_p99_ms: list[float] = field(default_factory=list)

    @property
    def gap_p50_ms(self) -> float:
        return pct(self.gaps_ms, 50)

    @property
    def gap_p99_ms(self) -> float:
        return pct(self.gaps_ms, 99)

    @property
    def wait_p99_ms(self) -> float:
        return pct(self.waits_ms, 99)

    @property
    def wait_max_ms(self) -> float:
        return max(self.waits_ms, default=float("nan"))

    @property
    def slowest_vs_fastest(self) -> float:
        if not self.per_worker or not max(self.per_worker):
            return float("nan")
        return min(self.per_worker) / max(self.per_worker)


def analyse(kind: str, logs: dict, limit: int, start_at: int, stop_at: int):
    """Merge the workers' logs of one round into an Outcome."""
    events = sorted(
        (t_acq, t_rel, t_req, worker)
        for worker, log in logs.items()
        for (t_req, t_acq, t_rel) in log
    )
    releases = sorted(e[1] for e in events)
    gaps = []
    for i in range(limit, len(events)):
        t_acq, _, t_req, _ = events[i]
        freed = releases[i - limit]
        if t_req < freed:  # it was waiting when room was made
            gaps.append((t_acq - freed) / 1e6)
    # Sweep: releases sort before acquisitions at the same instant.
    points = sorted([(e[1], 0) for e in events] + [(e[0], 1) for e in events])
    holders = max_holders = over = 0
    for _, starts in points:
        holders += 1 if starts else -1
        max_holders = max(max_holders, holders)
        if starts and holders > limit:
            over += 1
    in_window = [e for e in events if e[0] <= stop_at]
    window_s = (stop_at - start_at) / 1e9
    return Outcome(
        kind=kind,
        window_s=window_s,
        cycles=len(in_window),
        cycles_per_s=len(in_window) / window_s,
        handoffs=len(gaps),
        gaps_ms=gaps,
        waits_ms=[(e[0] - e[2]) / 1e6 for e in events],
        per_worker=[sum(1 for e in in_window if e[3] == w) for w in sorted(logs)],
        over_limit=over,
        max_holders=max_holders,
        round_cycles_per_s=[len(in_window) / window_s],
        round_gap_p99_ms=[pct(gaps, 99)],
    )


def merge(outcomes: list[Outcome]) -> Outcome:
    """Combine one kind's rounds: sums, and percentiles of all samples."""
    window = sum(o.window_s for o in outcomes)
    cycles = sum(o.cycles for o in outcomes)
    return Outcome(
        kind=outcomes[0].kind,
        window_s=window,
        cycles=cycles,
        cycles_per_s=cycles / window,
        handoffs=sum(o.handoffs for o in outcomes),
        gaps_ms=[g for o in outcomes for g in o.gaps_ms],
        waits_ms=[w for o in outcomes for w in o.waits_ms],
        per_worker=[sum(c) for c in zip(*(o.per_worker for o in outcomes))],
        over_limit=sum(o.over_limit for o in outcomes),
        max_holders=max(o.max_holders for o in outcomes),
        round_cycles_per_s=[c for o in outcomes for c in o.round_cycles_per_s],
        round_gap_p99_ms=[g for o in outcomes for g in o.round_gap_p99_ms],
    )


def run(ctx, backends: dict[str, str]) -> dict:
    """Return {backend label: {kind: Outcome}}."""
    mp = multiprocessing.get_context("spawn")
    aliases = list(backends.values())
    tasks = [mp.Queue() for _ in range(WORKERS)]
    results = mp.Queue()
    procs = [
        mp.Process(target=_worker, args=(i, aliases, tasks[i], results), daemon=True)
        for i in range(WORKERS)
    ]
    for p in procs:
        p.start()
    rounds = ctx.size(full=4, quick=1)
    window = ctx.size(full=1.5, quick=0.4)
    by: dict = {label: {k: [] for k in KINDS} for label in backends}
    try:
        for _ in range(WORKERS):
            index, _, error = results.get(timeout=180)
            if error:
                raise RuntimeError(f"worker {index} failed to start: {error}")
        ctx.progress(f"{WORKERS} workers ready")
        for r in range(rounds):
            for label, alias in backends.items():
                order = KINDS if r % 2 == 0 else KINDS[::-1]
                for kind in order:
                    name = f"bench:kc:{label}:{kind}:{r}"
                    lead = 0.3
                    start_at = time.monotonic_ns() + int(lead * 1e9)
                    stop_at = start_at + int(window * 1e9)
                    for q in tasks:
                        q.put((kind, alias, name, start_at, stop_at))
                    logs = {}
                    for _ in range(WORKERS):
                        index, log, error = results.get(timeout=window + lead + 120)
                        if error:
                            raise RuntimeError(
                                f"{label} {kind}: worker {index}: {error}"
                            )
                        logs[index] = log
                    limit = 1 if kind == EXCLUSIVE else LIMIT
                    by[label][kind].append(
                        analyse(kind, logs, limit, start_at, stop_at)
                    )
                    ctx.progress(f"{label}, {kind}, round {r + 1}/{rounds}")
    finally:
        stop_workers(tasks, procs)
    return {
        label: {kind: merge(o) for kind, o in kinds.items()}
        for label, kinds in by.items()
    }

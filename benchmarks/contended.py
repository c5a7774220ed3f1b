"""Four processes contending for one Redis lock with a tiny critical section.

The workers are separate processes (spawned once, reused for every contender
and round) that loop ``acquire; counter += 1; release`` on one lock name for a
fixed window. Each records, on the machine-wide monotonic clock, when it asked
for the lock, when it got it and when it let go; the parent merges the four
logs to measure throughput, handoffs, waits, fairness and safety (lost
updates of the shared counter, and any overlap of two critical sections).
"""

from __future__ import annotations

import multiprocessing
import os
import time
from dataclasses import dataclass, field

from .core import pct, stop_workers

DISTLOCK = "django_distlock, auto_renew on (default)"
DISTLOCK_NORENEW = "django_distlock, auto_renew off"
REDISPY = "redis-py Lock, sleep 0.1 s"
REDISPY_FAST = "redis-py Lock, sleep 1 ms"
PRL = "python-redis-lock"
POTTERY = "pottery Redlock, 1 master"
CONTENDERS = [DISTLOCK, DISTLOCK_NORENEW, REDISPY, REDISPY_FAST, PRL, POTTERY]
WORKERS = 4
TTL = 30


def _make(kind: str, url: str):
    """Return ``cycle_parts(name) -> (acquire, release)`` for a contender."""
    import redis

    if kind in (DISTLOCK, DISTLOCK_NORENEW):
        from django_distlock import lock

        # The default (auto_renew on) is the row the targets are read from.
        renew = kind == DISTLOCK

        def parts(name):
            held = lock(name, ttl=TTL, timeout=30, auto_renew=renew)
            return (lambda: held.acquire() or _fail(name)), held.release

        return parts
    client = redis.Redis.from_url(url)
    if kind in (REDISPY, REDISPY_FAST):
        sleep = 0.1 if kind == REDISPY else 0.001

        def parts(name):
            held = client.lock(name, timeout=TTL, sleep=sleep, blocking_timeout=30)
            return (lambda: held.acquire() or _fail(name)), held.release

        return parts
    if kind == PRL:
        import redis_lock

        def parts(name):
            held = redis_lock.Lock(client, name, expire=TTL)
            return (lambda: held.acquire(timeout=30) or _fail(name)), held.release

        return parts
    if kind == POTTERY:
        from pottery import Redlock

        def parts(name):
            held = Redlock(key=name, masters={client}, auto_release_time=TTL)
            return (
                lambda: held.acquire(blocking=True, timeout=30) or _fail(name)
            ), held.release

        return parts
    raise ValueError(kind)


def _fail(name):
    raise RuntimeError(f"{name}: not acquired within 30 s")


def _worker(index: int, url: str, tasks, results, counter) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
    from .common import quiet_imports

    quiet_imports()
    import django

    django.setup()
    # Import, connect and load scripts for every contender before reporting
    # ready, on names of this worker's own: the first round must not pay it.
    made = {}
    try:
        for kind in CONTENDERS:
            made[kind] = _make(kind, url)
            for _ in range(3):
                acquire, release = made[kind](f"bench:c:warm:{index}")
                acquire()
                release()
    except Exception as e:
        results.put((index, None, f"{type(e).__name__}: {e}"))
        return
    results.put((index, None, None))  # ready
    clock = time.monotonic_ns
    while True:
        task = tasks.get()
        if task is None:
            return
        kind, name, start_at, stop_at = task
        try:
            parts = made[kind]
            log = []
            while clock() < start_at:
                time.sleep(0.0005)
            while clock() < stop_at:
                acquire, release = parts(name)
                t_req = clock()
                acquire()
                t_acq = clock()
                counter.value = counter.value + 1
                t_rel = clock()
                release()
                log.append((t_req, t_acq, t_rel))
            results.put((index, log, None))
        except Exception as e:  # reported by the parent
            results.put((index, [], f"{type(e).__name__}: {e}"))


@dataclass
class Outcome:
    name: str
    window_s: float
    cycles: int
    cycles_per_s: float
    handoffs: int
    changed_share: float
    gap_p50_ms: float
    gap_p99_ms: float
    wait_p50_ms: float
    wait_p99_ms: float
    wait_max_ms: float
    per_worker: list[int]
    #: The slowest worker's cycles over the fastest's, over the whole window.
    slowest_vs_fastest: float
    lost_updates: int
    overlaps: int
    waits_ms: list[float]
    round_cycles_per_s: list[float] = field(default_factory=list)
    #: The same ratio in the round where it was lowest (1.5 s rounds: one
    #: worker descheduled for a moment on a shared machine shows here).
    worst_round_share: float = float("nan")
    gaps_ms: list[float] = field(default_factory=list)
    #: The gap p99 of the round where it was highest.
    worst_round_gap_p99_ms: float = float("nan")


def analyse(name, logs, start_at, stop_at, counter_value) -> Outcome:
    """Merge the workers' logs into one Outcome."""
    events = sorted(
        (t_acq, t_rel, t_req, worker)
        for worker, log in logs.items()
        for (t_req, t_acq, t_rel) in log
    )
    total = len(events)
    in_window = [e for e in events if e[0] <= stop_at]
    window_s = (stop_at - start_at) / 1e9
    changed = 0
    gaps = []
    overlaps = 0
    latest_release = None
    for prev, cur in zip(events, events[1:]):
        if cur[3] != prev[3]:
            changed += 1
        gaps.append((cur[0] - prev[1]) / 1e6)
    for t_acq, t_rel, _, _ in events:
        if latest_release is not None and t_acq < latest_release:
            overlaps += 1
        latest_release = max(latest_release or 0, t_rel)
    waits = [(t_acq - t_req) / 1e6 for t_acq, _, t_req, _ in events]
    per_worker = [sum(1 for e in in_window if e[3] == w) for w in sorted(logs)]
    handoffs = max(total - 1, 0)
    return Outcome(
        name=name,
        window_s=window_s,
        cycles=len(in_window),
        cycles_per_s=len(in_window) / window_s,
        handoffs=handoffs,
        changed_share=changed / handoffs if handoffs else float("nan"),
        gap_p50_ms=pct(gaps, 50),
        gap_p99_ms=pct(gaps, 99),
        wait_p50_ms=pct(waits, 50),
        wait_p99_ms=pct(waits, 99),
        wait_max_ms=max(waits, default=float("nan")),
        per_worker=per_worker,
        slowest_vs_fastest=_share(per_worker),
        lost_updates=total - counter_value,
        overlaps=overlaps,
        waits_ms=waits,
        round_cycles_per_s=[len(in_window) / window_s],
        worst_round_share=_share(per_worker),
        gaps_ms=gaps,
        worst_round_gap_p99_ms=pct(gaps, 99),
    )


def _share(per_worker: list[int]) -> float:
    """The slowest worker's cycles over the fastest's."""
    if not per_worker or not max(per_worker):
        return float("nan")
    return min(per_worker) / max(per_worker)


def merge(outcomes: list[Outcome]) -> Outcome:
    """Combine the rounds of one contender (sums, and percentiles of rounds)."""
    if len(outcomes) == 1:
        return outcomes[0]
    window = sum(o.window_s for o in outcomes)
    cycles = sum(o.cycles for o in outcomes)
    handoffs = sum(o.handoffs for o in outcomes)
    per_worker = [sum(c) for c in zip(*(o.per_worker for o in outcomes))]
    waits = [w for o in outcomes for w in o.waits_ms]
    gaps = [g for o in outcomes for g in o.gaps_ms]
    return Outcome(
        name=outcomes[0].name,
        window_s=window,
        cycles=cycles,
        cycles_per_s=cycles / window,
        handoffs=handoffs,
        changed_share=sum(o.changed_share * o.handoffs for o in outcomes) / handoffs,
        # Percentiles of all the rounds' gaps together, like the waits.
        gap_p50_ms=pct(gaps, 50),
        gap_p99_ms=pct(gaps, 99),
        wait_p50_ms=pct(waits, 50),
        wait_p99_ms=pct(waits, 99),
        wait_max_ms=max(waits),
        per_worker=per_worker,
        slowest_vs_fastest=_share(per_worker),
        worst_round_share=min(o.worst_round_share for o in outcomes),
        gaps_ms=gaps,
        worst_round_gap_p99_ms=max(o.worst_round_gap_p99_ms for o in outcomes),
        lost_updates=sum(o.lost_updates for o in outcomes),
        overlaps=sum(o.overlaps for o in outcomes),
        waits_ms=waits,
        round_cycles_per_s=[c for o in outcomes for c in o.round_cycles_per_s],
    )


def run(ctx) -> dict:
    """Return {"outcomes": {name: Outcome}} for every contender."""
    mp = multiprocessing.get_context("spawn")
    tasks = [mp.Queue() for _ in range(WORKERS)]
    results = mp.Queue()
    counter = mp.RawValue("q", 0)
    procs = [
        mp.Process(
            target=_worker,
            args=(i, ctx.redis_url, tasks[i], results, counter),
            daemon=True,
        )
        for i in range(WORKERS)
    ]
    for p in procs:
        p.start()
    for _ in range(WORKERS):
        index, _, error = results.get(timeout=180)
        if error:
            raise RuntimeError(f"worker {index} failed to start: {error}")
    rounds = ctx.size(full=6, quick=1)
    window = ctx.size(full=1.5, quick=0.5)
    by_name: dict[str, list[Outcome]] = {n: [] for n in CONTENDERS}
    try:
        for r in range(rounds):
            order = CONTENDERS if r % 2 == 0 else CONTENDERS[::-1]
            for kind in order:
                counter.value = 0
                name = f"bench:c:{kind}:{r}"
                lead = 0.5
                start_at = time.monotonic_ns() + int(lead * 1e9)
                stop_at = start_at + int(window * 1e9)
                for q in tasks:
                    q.put((kind, name, start_at, stop_at))
                logs = {}
                for _ in range(WORKERS):
                    index, log, error = results.get(timeout=window + lead + 120)
                    if error:
                        raise RuntimeError(f"{kind}: worker {index}: {error}")
                    logs[index] = log
                by_name[kind].append(
                    analyse(kind, logs, start_at, stop_at, counter.value)
                )
                ctx.progress(f"{kind}, round {r + 1}/{rounds}")
    finally:
        stop_workers(tasks, procs)
    return {"outcomes": {n: merge(o) for n, o in by_name.items()}}

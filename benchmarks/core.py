"""Timing primitives: contenders alternating in rounds, percentiles, ratios."""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

#: ``run(n)`` performs n cycles and returns each cycle's duration in ns.
Runner = Callable[[int], list[int]]


def cycles(cycle: Callable[[], object]) -> Runner:
    """Turn a one-cycle callable into a Runner that times every cycle."""

    def run(n: int) -> list[int]:
        clock = time.perf_counter_ns
        out = []
        append = out.append
        for _ in range(n):
            t0 = clock()
            cycle()
            append(clock() - t0)
        return out

    return run


def pct(values: list[float], q: float) -> float:
    """Return the q-th percentile (0..100) of ``values``, linear interpolation."""
    if not values:
        return math.nan
    data = sorted(values)
    if len(data) == 1:
        return data[0]
    pos = (len(data) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


@dataclass
class Series:
    """The samples of one contender, kept per round."""

    name: str
    rounds: list[list[int]] = field(default_factory=list)

    @property
    def samples(self) -> list[int]:
        return [s for r in self.rounds for s in r]

    def p(self, q: float) -> float:
        """Percentile in microseconds."""
        return pct(self.samples, q) / 1000

    def round_p50s(self) -> list[float]:
        return [pct(r, 50) / 1000 for r in self.rounds if r]


def alternate(
    runners: dict[str, Runner],
    *,
    rounds: int,
    per_round: int,
    warmup: int,
    progress: Callable[[str], None] = lambda s: None,
) -> dict[str, Series]:
    """Run every contender ``rounds`` times, ``per_round`` cycles each time.

    The order rotates every round (and runs backwards every other round), so
    that no contender always follows the same neighbour, and drifts of the
    machine's load hit every contender alike. ``warmup`` cycles per contender
    run first and are not recorded (connections, script cache, imports).
    """
    names = list(runners)
    for name in names:
        runners[name](warmup)
    series = {name: Series(name) for name in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        if r % 2:
            order.reverse()
        for name in order:
            gc.collect()
            series[name].rounds.append(runners[name](per_round))
        progress(f"round {r + 1}/{rounds}")
    return series


def ratio_of(series: Series, base: Series) -> tuple[float, float, float]:
    """Return (pooled p50 ratio, lowest, highest per-round p50 ratio)."""
    pooled = series.p(50) / base.p(50)
    per_round = [a / b for a, b in zip(series.round_p50s(), base.round_p50s())]
    if not per_round:
        return pooled, pooled, pooled
    qs = (
        (pct(per_round, 10), pct(per_round, 90))
        if len(per_round) >= 5
        else (
            min(per_round),
            max(per_round),
        )
    )
    return pooled, qs[0], qs[1]


def median(values):
    return statistics.median(values) if values else math.nan


def stop_workers(tasks, procs) -> None:
    """Tell every worker process to stop (a None task) and wait for it,
    terminating one that does not stop within 10 s."""
    for q in tasks:
        q.put(None)
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.terminate()
            p.join()

"""The report's part for the kinds scenario (shared locks and semaphores)."""

from __future__ import annotations

from . import kinds_contended
from .core import ratio_of


def target_rows(block: dict) -> list[tuple[str, str, str, bool | None]]:
    """Return (target, measured, detail, met) rows for the issue-22 targets."""
    rows = []
    for label, b in block["backends"].items():
        s = b["series"]
        for name, (ref, limit) in b["targets"].items():
            target = f"{label}: {name} p50 ≤ {limit:.2f}x {ref}"
            if name not in s or ref not in s:
                rows.append((target, "-", "; ".join(block["notes"]), None))
                continue
            pooled, lo, hi = ratio_of(s[name], s[ref])
            rows.append(
                (
                    target,
                    f"{pooled:.2f}x",
                    f"{s[name].p(50):.0f} vs {s[ref].p(50):.0f} µs; "
                    f"per round {lo:.2f}-{hi:.2f}",
                    pooled <= limit,
                )
            )
    for label, o in block.get("contended", {}).items():
        x = o[kinds_contended.EXCLUSIVE]
        p = o[kinds_contended.SEMAPHORE]
        ratio = p.cycles_per_s / x.cycles_per_s
        per_round = ", ".join(
            f"{a / b:.2f}" for a, b in zip(p.round_cycles_per_s, x.round_cycles_per_s)
        )
        n = kinds_contended.WORKERS
        hold = kinds_contended.HOLD_S * 1000
        rows += [
            (
                f"{label}, {n} processes, {hold:.0f} ms held: limit-"
                f"{kinds_contended.LIMIT} semaphore cycles/s ≥ "
                f"{kinds_contended.RATIO_TARGET}x exclusive",
                f"{ratio:.2f}x",
                f"{p.cycles_per_s:.0f} vs {x.cycles_per_s:.0f}/s; per round "
                + per_round,
                ratio >= kinds_contended.RATIO_TARGET,
            ),
            (
                f"{label}, {n} processes: semaphore handoff p99 ≤ "
                f"{kinds_contended.HANDOFF_P99_TARGET_MS:.0f} ms",
                f"{p.gap_p99_ms:.2f} ms",
                f"worst round {max(p.round_gap_p99_ms):.2f} ms; exclusive "
                f"{x.gap_p99_ms:.2f} ms",
                p.gap_p99_ms <= kinds_contended.HANDOFF_P99_TARGET_MS,
            ),
            (
                f"{label}, {n} processes: no grant over the limit",
                f"{p.over_limit} / {x.over_limit}",
                f"semaphore / exclusive; most holders at once {p.max_holders} / "
                f"{x.max_holders}",
                p.over_limit == 0 and x.over_limit == 0,
            ),
        ]
    return rows


def _ok(met: bool | None) -> str:
    if met is None:
        return "n/a"
    return "yes" if met else "**NO**"


def section(block: dict) -> list[str]:
    """Return the markdown lines of the kinds section (targets first)."""
    lines = [
        "",
        "## Shared locks and semaphores",
        "",
        "### Targets (issue 22)",
        "",
        "| target | measured | detail | met |",
        "|---|---:|---|---|",
    ]
    for target, measured, detail, met in target_rows(block):
        lines.append(f"| {target} | {measured} | {detail} | {_ok(met)} |")
    lines += [
        "",
        "### Uncontended acquire + release, by kind",
        "",
        "`with <handle>: pass` including creating the handle, auto_renew off, "
        "one name per contender. Every row runs in a spawned process of its "
        "own kind: the current package in one, the package at "
        f"`{block['before']}` (before issue 22, taken out of git for the run) "
        "in another; the rounds alternate between them. Ratios are to the "
        "current exclusive cycle.",
        "",
        "| backend | contender | p50 µs | p99 µs | p50 / exclusive "
        "| per-round ratio 10-90% |",
        "|---|---|---:|---:|---:|---:|",
    ]
    n_rounds = n_cycles = 0
    for label, b in block["backends"].items():
        s = b["series"]
        base = s[b["floor"]]
        for name, series in s.items():
            pooled, lo, hi = ratio_of(series, base)
            lines.append(
                f"| {label} | {name} | {series.p(50):.0f} | {series.p(99):.0f} | "
                f"{pooled:.2f} | {lo:.2f}-{hi:.2f} |"
            )
        n_rounds, n_cycles = len(base.rounds), len(base.samples)
    lines += ["", f"{n_rounds} rounds, {n_cycles} cycles per contender."]
    lines += [f"Note: {note}." for note in block["notes"]]
    contended = block.get("contended", {})
    if contended:
        n = kinds_contended.WORKERS
        lines += [
            "",
            f"### {n} processes, {kinds_contended.HOLD_S * 1000:.0f} ms critical "
            f"section: limit-{kinds_contended.LIMIT} semaphore vs exclusive lock",
            "",
            "The same processes loop acquire / sleep 1 ms / release on one name, "
            "the two kinds alternating in rounds. Handoff: from the release "
            "that made room to a waiting process returning from acquire. "
            "Wait: from calling acquire to returning.",
            "",
            "| backend | kind | cycles/s | handoff p50 / p99 ms "
            "| wait p99 / max ms | slowest / fastest worker | most holders "
            "| over limit |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for label, outcomes in contended.items():
            for kind, o in outcomes.items():
                lines.append(
                    f"| {label} | {kind} | {o.cycles_per_s:.0f} | "
                    f"{o.gap_p50_ms:.2f} / {o.gap_p99_ms:.2f} | "
                    f"{o.wait_p99_ms:.1f} / {o.wait_max_ms:.1f} | "
                    f"{o.slowest_vs_fastest:.1%} | {o.max_holders} | "
                    f"{o.over_limit} |"
                )
        any_o = next(iter(next(iter(contended.values())).values()))
        lines += ["", f"Window {any_o.window_s:.1f} s per kind and backend in total."]
    return lines

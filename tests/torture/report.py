"""Print a torture report (``torture-report.jsonl``) as Markdown tables.

Usage: ``python -m tests.torture.report REPORT.jsonl`` (every run, one row
each), or ``python -m tests.torture.report --release REPORT.jsonl`` (the
release table: per fault and backend, the sections both oracles checked, the
violations each found, and the longest unavailability after the fault).
"""

from __future__ import annotations

import json
import sys


def _gap(row: dict) -> float | None:
    return row.get("unavailable_after_fault")


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} s"


def table(rows: list[dict]) -> str:
    """Return the Markdown table of verdict rows."""
    lines = [
        "| scenario | backend | critical sections (confirmed) | violations "
        "| fenced off / losses reported | availability (attempts) | longest wait "
        "| acquirable after fault | recovered | notes |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        notes = "; ".join(
            n for n in r["notes"] if not n.startswith(("overlap", "unexpected"))
        )[:160]
        lines.append(
            f"| {r['scenario']} | {r['backend']} | {r['critical_sections']} "
            f"({r['confirmed']}) | {r['violations']} | {r['fenced_off']} / "
            f"{r['reported_losses']} | {r['availability']:.1%} ({r['attempts']}) "
            f"| {r['longest_wait']:.2f} s | {_seconds(_gap(r))} "
            f"| {r['recovered_workers']}/{r['workers']} "
            f"| {notes.replace('|', '/')} |"
        )
    total = sum(r["critical_sections"] for r in rows)
    bad = sum(r["violations"] for r in rows)
    lines.append("")
    lines.append(
        f"{len(rows)} scenario runs, {total} critical sections checked, "
        f"{bad} violations."
    )
    return "\n".join(lines)


def _mutex(row: dict) -> str:
    """The mutex model's count, or n/a where it does not apply (reentrant
    backends, readers and writers, permits: not one holder at a time)."""
    return str(row["nonlinearizable"]) if row.get("mutex_checked", True) else "n/a"


def met(row: dict) -> str:
    """Return whether a run met the availability target after its fault."""
    if not row.get("fault"):
        return "n/a (no fault window)"
    gap = _gap(row)
    if gap is None:  # some name was never acquired again
        return "not met"
    return "met" if gap <= row["target"] else "not met"


def release_table(rows: list[dict]) -> str:
    """Return the release table: one row per fault and backend (sorted: the
    runs of ``--shards`` report in the order they end)."""
    rows = sorted(rows, key=lambda r: (r["scenario"], r["backend"]))
    lines = [
        "| fault | backend | sections checked | interval checker violations "
        "| mutex model violations | longest unavailability after the fault "
        "(names / probe) | target | met |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        names = _seconds(r.get("names_free_after"))
        probe = _seconds(r.get("probe_free_after"))
        lines.append(
            f"| {r['scenario']} | {r['backend']} | {r['critical_sections']:,} "
            f"| {r.get('interval_violations', r['violations'])} "
            f"| {_mutex(r)} | {_seconds(_gap(r))} ({names} / {probe}) "
            f"| {r.get('target', 2.0):.0f} s | {met(r)} |"
        )
    total = sum(r["critical_sections"] for r in rows)
    bad = sum(r["violations"] for r in rows)
    missed = sum(1 for r in rows if met(r) == "not met")
    lines.append("")
    lines.append(
        f"{len(rows)} runs, {total:,} critical sections checked by both oracles, "
        f"{bad} violations; availability target not met in {missed} runs."
    )
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    release = "--release" in argv
    (path,) = [a for a in argv if a != "--release"]
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    print(release_table(rows) if release else table(rows))


if __name__ == "__main__":
    main(sys.argv[1:])

"""Print a torture report (``torture-report.jsonl``) as a Markdown table.

Usage: ``python -m tests.torture.report REPORT.jsonl``.
"""

from __future__ import annotations

import json
import sys


def table(rows: list[dict]) -> str:
    """Return the Markdown table of verdict rows."""
    lines = [
        "| scenario | backend | critical sections (confirmed) | violations "
        "| fenced off / losses reported | availability (attempts) | longest wait "
        "| recovered | notes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        notes = "; ".join(
            n for n in r["notes"] if not n.startswith(("overlap", "unexpected"))
        )[:160]
        lines.append(
            f"| {r['scenario']} | {r['backend']} | {r['critical_sections']} "
            f"({r['confirmed']}) | {r['violations']} | {r['fenced_off']} / "
            f"{r['reported_losses']} | {r['availability']:.1%} ({r['attempts']}) "
            f"| {r['longest_wait']:.2f} s | {r['recovered_workers']}/{r['workers']} "
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


def main(path: str) -> None:
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    print(table(rows))


if __name__ == "__main__":
    main(sys.argv[1])

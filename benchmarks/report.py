"""Render the results as markdown: targets first, then one table per scenario."""

from __future__ import annotations

import math

from . import contended, database, kinds_report, redlock, scale, uncontended
from .core import ratio_of

#: Peers' figures from ../shared/ANCHORS.md (same kind of machine, other runs).
ANCHOR_UNCONTENDED = {
    uncontended.FLOOR: "1.00 (138-162 µs)",
    uncontended.REDISPY: "0.99-1.21",
    uncontended.DJANGO_REDIS: "1.19-1.31",
    uncontended.PRL: "1.25-1.60",
    uncontended.PRL_RENEW: "2.37-3.18",
    uncontended.POTTERY: "5.3-6.5",
}
ANCHOR_CONTENDED = {
    contended.REDISPY: "2.0-2.8k/s, 0.2-0.3%, 0.55/100 ms, max 1.9-2.6 s",
    contended.REDISPY_FAST: "1.4-2.4k/s, 23-33%, 0.22-0.35/0.5-0.9 ms, max ~50 ms",
    contended.PRL: "1.3-1.9k/s, 82-98%, 0.3-0.6/0.65-1.0 ms, max 12-124 ms",
    contended.POTTERY: "0.5-0.7k/s, 2-3%, 1-1.5/21-71 ms, max 0.66-1 s",
}
ANCHOR_REDLOCK = {
    redlock.FANOUT: "1.7-2.2x the single-node floor",
    redlock.POTTERY: "17-20x the fan-out",
}
ANCHOR_DATABASE = {
    database.FLOOR: "1.00 (95-115 µs)",
    database.PGLOCKS: "1.8-2.0",
    database.ROW_LOCK: "2.0-2.2",
    database.ORM: "6.4-7.0",
    database.DB_MUTEX: "19-20",
}


def _ok(met: bool | None) -> str:
    if met is None:
        return "n/a"
    return "yes" if met else "**NO**"


def _f(value: float, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def targets(results: dict) -> list[tuple[str, str, str, bool | None]]:
    """Return (target, measured, reference, met) rows for every issue-7 target."""
    rows = []
    u = results.get("uncontended")
    if u:
        s = u["series"]
        for name, (ref, limit) in u["targets"].items():
            ratio = s[name].p(50) / s[ref].p(50)
            detail = f"{s[name].p(50):.0f} vs {s[ref].p(50):.0f} µs"
            if "async" in name and uncontended.AFLOOR in s:
                afloor = s[uncontended.AFLOOR].p(50)
                detail += (
                    f"; {s[name].p(50) / afloor:.2f}x the async raw floor, which "
                    f"is {afloor / s[uncontended.FLOOR].p(50):.2f}x the sync floor"
                )
                if uncontended.AFLOOR_DEADLINE in s:
                    deadline = s[uncontended.AFLOOR_DEADLINE].p(50)
                    detail += (
                        f"; {s[name].p(50) / deadline:.2f}x that floor with "
                        "each command under asyncio.timeout"
                    )
            rows.append(
                (
                    f"{name}: p50 ≤ {limit:.2f}x {ref}",
                    f"{ratio:.2f}x",
                    detail,
                    ratio <= limit,
                )
            )
        d, r = s[uncontended.DISTLOCK], s[uncontended.REDISPY]
        rows.append(
            (
                "django_distlock faster than redis-py Lock (p50, same run)",
                f"{d.p(50) / r.p(50):.2f}x redis-py",
                f"{d.p(50):.0f} vs {r.p(50):.0f} µs",
                d.p(50) < r.p(50),
            )
        )
        if uncontended.ADISTLOCK_TASKS in s:
            t, f = s[uncontended.ADISTLOCK_TASKS], s[uncontended.AFLOOR_TASKS]
            rows.append(
                (
                    f"django_distlock async, {uncontended.TASKS} tasks on one loop, "
                    "× the async raw floor the same way (reported, not a target)",
                    f"{t.p(50) / f.p(50):.2f}x",
                    f"{t.p(50):.0f} vs {f.p(50):.0f} µs a cycle (wall ÷ cycles)",
                    None,
                )
            )
    c = results.get("contended")
    if c:
        o = c["outcomes"]
        d, p = o[contended.DISTLOCK], o[contended.PRL]
        rows += [
            (
                "4 processes: cycles/s ≥ 1.5x python-redis-lock",
                f"{d.cycles_per_s / p.cycles_per_s:.2f}x",
                f"{d.cycles_per_s:.0f} vs {p.cycles_per_s:.0f}/s; per round "
                + ", ".join(
                    f"{a / b:.2f}"
                    for a, b in zip(d.round_cycles_per_s, p.round_cycles_per_s)
                ),
                d.cycles_per_s >= 1.5 * p.cycles_per_s,
            ),
            (
                "4 processes: holder changes on ≥ 80% of handoffs",
                f"{d.changed_share:.1%}",
                f"python-redis-lock {p.changed_share:.1%}",
                d.changed_share >= 0.80,
            ),
            (
                "4 processes: slowest worker ≥ 90% of the fastest (cycles "
                "over the whole run)",
                f"{d.slowest_vs_fastest:.1%}",
                f"worst round {d.worst_round_share:.1%}; python-redis-lock "
                f"{p.slowest_vs_fastest:.1%} (worst round "
                f"{p.worst_round_share:.1%})",
                d.slowest_vs_fastest >= 0.90,
            ),
            (
                "4 processes: handoff gap p99 ≤ 1 ms",
                f"{d.gap_p99_ms:.2f} ms",
                f"worst round {d.worst_round_gap_p99_ms:.2f} ms; python-redis-lock "
                f"{p.gap_p99_ms:.2f} ms (worst round {p.worst_round_gap_p99_ms:.2f})",
                d.gap_p99_ms <= 1.0,
            ),
            (
                "4 processes: longest wait ≤ 20 ms",
                f"{d.wait_max_ms:.1f} ms",
                f"python-redis-lock {p.wait_max_ms:.1f} ms",
                d.wait_max_ms <= 20.0,
            ),
            (
                "4 processes: no lost update, no overlap (every contender)",
                ", ".join(f"{x.lost_updates}/{x.overlaps}" for x in o.values()),
                "lost/overlapping per contender",
                all(x.lost_updates == 0 and x.overlaps == 0 for x in o.values()),
            ),
        ]
    r = results.get("redlock")
    if r:
        s = r["series"]
        d, f, p = s[redlock.DISTLOCK], s[redlock.FANOUT], s[redlock.POTTERY]
        rows += [
            (
                "Redlock, 5 nodes: p50 ≤ 1.2x raw pipelined fan-out",
                f"{d.p(50) / f.p(50):.2f}x",
                f"{d.p(50):.0f} vs {f.p(50):.0f} µs",
                d.p(50) <= 1.2 * f.p(50),
            ),
            (
                "Redlock, 5 nodes: ≥ 10x faster than pottery",
                f"{p.p(50) / d.p(50):.1f}x",
                f"{p.p(50):.0f} vs {d.p(50):.0f} µs",
                p.p(50) >= redlock.POTTERY_FACTOR * d.p(50),
            ),
        ]
    db = results.get("database")
    if db:
        s = db["series"]
        f = s[database.FLOOR]
        if database.DISTLOCK in s:
            d = s[database.DISTLOCK]
            rows.append(
                (
                    "PostgreSQL: cycle ≤ 3x raw advisory lock pair",
                    f"{d.p(50) / f.p(50):.2f}x",
                    f"{d.p(50):.0f} vs {f.p(50):.0f} µs"
                    + (
                        f"; {d.p(50) / s[database.DURABLE].p(50):.2f}x two raw "
                        "durable UPDATEs"
                        if database.DURABLE in s
                        else ""
                    ),
                    d.p(50) <= 3 * f.p(50),
                )
            )
        else:
            rows.append(
                (
                    "PostgreSQL: cycle ≤ 3x raw advisory lock pair",
                    "-",
                    "database backend not built yet",
                    None,
                )
            )
    m = results.get("scale")
    if m:
        rows.append(
            (
                f"{m['count']:,} held locks: Redis memory per lock ≤ 3x bare SET NX PX",
                f"{m['ratio']:.2f}x",
                f"{m['distlock_bytes']:.0f} vs {m['bare_bytes']:.0f} B",
                m["ratio"] <= scale.BARE_BYTES_TARGET_FACTOR,
            )
        )
        if "list_json_s" in m:
            slowest = max(m["list_json_s"], m["list_table_s"])
            rows.append(
                (
                    f"{m['count']:,} held locks: `manage.py locks list` < 2 s",
                    f"{slowest:.2f} s",
                    f"json {m['list_json_s']:.2f} s, table {m['list_table_s']:.2f} s"
                    f" (whole process{_median_of(m.get('list_runs', 1))});"
                    " bare Django process start "
                    f"{m.get('django_startup_s', float('nan')):.2f} s",
                    slowest < scale.LIST_TARGET_S,
                )
            )
        else:
            rows.append(
                ("`manage.py locks list` < 2 s", "-", "command not built yet", None)
            )
        if "admin_p50_ms" in m:
            rows.append(
                (
                    f"{m['count']:,} held locks: admin changelist < 300 ms",
                    f"{m['admin_p50_ms']:.0f} ms p50",
                    f"first {m['admin_first_ms']:.0f} ms, max "
                    f"{m['admin_max_ms']:.0f} ms, search {m['admin_search_ms']:.0f} ms",
                    m["admin_max_ms"] < scale.ADMIN_TARGET_MS,
                )
            )
        else:
            rows.append(
                ("admin changelist < 300 ms", "-", "admin page not built yet", None)
            )
    return rows


def _series_table(block: dict, anchors: dict, note: str) -> list[str]:
    s = block["series"]
    floor = s[block["floor"]]
    lines = [
        note,
        "",
        "| contender | p50 µs | p99 µs | p50 / floor | per-round ratio 10-90% "
        "| peers' anchor (× floor) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name, series in s.items():
        pooled, lo, hi = ratio_of(series, floor)
        lines.append(
            f"| {name} | {series.p(50):.0f} | {series.p(99):.0f} | "
            f"{pooled:.2f} | {lo:.2f}-{hi:.2f} | {anchors.get(name, '')} |"
        )
    n = len(floor.samples)
    lines += ["", f"{len(floor.rounds)} rounds, {n} cycles per contender."]
    return lines


def render(results, skipped, errors, meta, image_prefix: str | None = None) -> str:
    """Return the report; with ``image_prefix``, each section shows its plot."""

    def image(stem: str, alt: str) -> list[str]:
        if image_prefix is None:
            return []
        return ["", f"![{alt}]({image_prefix}bench_{stem}.png)"]

    lines = ["# django_distlock benchmark results", ""]
    if meta.get("quick"):
        lines += [
            "**Quick (smoke) run: too few cycles for the numbers to mean anything.**",
            "",
        ]
    v = meta.get("versions", {})
    load = meta.get("load_start")
    lines += [
        f"Run {meta.get('date', '?')} in {meta.get('duration_s', 0):.0f} s on "
        f"{meta.get('cpus', '?')} CPUs (load average "
        f"{_f(load[0], 1) if load else '?'} at start, "
        f"{_f(meta['load_end'][0], 1) if meta.get('load_end') else '?'} at end); "
        f"Python {meta.get('python', '?')}, Redis {meta.get('redis_server', '?')}, "
        f"PostgreSQL {meta.get('postgres', '-')}; "
        + ", ".join(f"{k} {val}" for k, val in v.items())
        + ". Every server on loopback; contenders alternate in rounds in one "
        "process, and every ratio compares figures of this run.",
        "",
        "## Targets (issue 7)",
        "",
        "| target | measured | detail | met |",
        "|---|---:|---|---|",
    ]
    for target, measured, detail, met in targets(results):
        lines.append(f"| {target} | {measured} | {detail} | {_ok(met)} |")
    for name, reason in skipped.items():
        lines.append(f"| {name} scenario | - | skipped: {reason} | n/a |")
    for name in errors:
        lines.append(f"| {name} scenario | - | **crashed** (see log) | **NO** |")

    if "uncontended" in results:
        lines += ["", "## Uncontended acquire + release, one Redis", ""]
        lines += _series_table(
            results["uncontended"],
            ANCHOR_UNCONTENDED,
            "One client, one process, `with <lock>: pass` including creating the "
            "lock object; the floor is `SET NX PX` + `EVALSHA` compare-and-delete "
            "with a fresh token. Async rows run on one event loop.",
        )
        lines += image("uncontended", "Uncontended cycle as a multiple of the floor")
    if "contended" in results:
        lines += [
            "",
            "## Four processes contending for one Redis lock",
            "",
            "Each worker loops acquire / read-modify-write a shared counter / "
            "release. Gap: from the holder calling release to the next holder "
            "returning from acquire. Wait: from calling acquire to returning.",
            "",
            "| contender | cycles/s | holder changed | gap p50 / p99 ms "
            "| wait p50 / p99 / max ms | slowest / fastest worker (worst round) "
            "| lost / overlaps | peers' anchor |",
            "|---|---:|---:|---:|---:|---:|---:|---|",
        ]
        for name, o in results["contended"]["outcomes"].items():
            lines.append(
                f"| {name} | {o.cycles_per_s:.0f} | {o.changed_share:.1%} | "
                f"{o.gap_p50_ms:.2f} / {o.gap_p99_ms:.2f} | "
                f"{o.wait_p50_ms:.2f} / {o.wait_p99_ms:.2f} / {o.wait_max_ms:.1f} | "
                f"{o.slowest_vs_fastest:.1%} ({o.worst_round_share:.1%}) | "
                f"{o.lost_updates} / {o.overlaps} | "
                f"{ANCHOR_CONTENDED.get(name, '')} |"
            )
        any_o = next(iter(results["contended"]["outcomes"].values()))
        lines += [
            "",
            f"Window {any_o.window_s:.1f} s per contender in total "
            "(rounds alternate the contenders).",
        ]
        lines += image("contended", "Four processes: throughput and waits")
    if "redlock" in results:
        lines += ["", "## Redlock, five redis-server processes", ""]
        lines += _series_table(
            results["redlock"],
            ANCHOR_REDLOCK,
            "Uncontended cycle; the floor here is the raw pipelined fan-out "
            "(`SET NX PX` to all five sockets, read all replies; then the same "
            "for `EVALSHA` compare-and-delete). The diagnostic row replays the "
            "commands django_distlock's backend sends (recorded from one real "
            "cycle) through the same bare sockets: the gap between it and the "
            "floor is what those commands cost the servers (a fencing counter, "
            "a release that also looks for waiters), the gap between it and the "
            "backend is the backend's Python side (it can be negative: the backend's "
            "executor is leaner than redis-py's `send_command`/`read_response` "
            "that the raw rows use).",
        )
        lines += image("redlock", "Redlock on five nodes")
    if "database" in results:
        lines += ["", "## PostgreSQL, uncontended cycle", ""]
        lines += _series_table(
            results["database"],
            ANCHOR_DATABASE,
            "The floor is `pg_advisory_lock` + `pg_advisory_unlock` on a raw "
            "psycopg connection in autocommit mode.",
        )
        lines += image("database", "PostgreSQL cycle as a multiple of the floor")
    if "kinds" in results:
        lines += kinds_report.section(results["kinds"])
        lines += image("kinds", "Shared locks and semaphores by backend")
    if "scale" in results:
        m = results["scale"]
        lines += [
            "",
            f"## {m['count']:,} held locks on one Redis",
            "",
            "| measure | value |",
            "|---|---:|",
            f"| Redis memory per bare `SET NX PX` lock | {m['bare_bytes']:.0f} B |",
            f"| Redis memory per django_distlock lease | {m['distlock_bytes']:.0f} B |",
            f"| taking them (8 threads, public API) | {m['acquire_s']:.1f} s |",
        ]
        if "holders_s" in m:
            lines.append(
                f"| iterating the backend's `holders()` | {m['holders_s']:.2f} s |"
            )
        if "list_json_s" in m:
            lines += [
                f"| `manage.py locks list --format json` (whole process) "
                f"| {m['list_json_s']:.2f} s |",
                f"| `manage.py locks list` table (whole process) "
                f"| {m['list_table_s']:.2f} s |",
            ]
            if "django_startup_s" in m:
                lines.append(
                    "| a bare process start with `django.setup()` (for scale) "
                    f"| {m['django_startup_s']:.2f} s |"
                )
        if "admin_p50_ms" in m:
            lines += [
                f"| admin changelist, first request | {m['admin_first_ms']:.0f} ms |",
                f"| admin changelist, p50 of the next | {m['admin_p50_ms']:.0f} ms |",
                f"| admin changelist, search | {m['admin_search_ms']:.0f} ms |",
            ]
        lines += image("memory", "Redis memory per held lock")
    lines.append("")
    return "\n".join(lines)


START = "<!-- bench:results:start (written by python -m benchmarks) -->"
END = "<!-- bench:results:end -->"


def publish(text: str, page) -> bool:
    """Copy the report into ``page`` between the result markers, if it has them.

    Headings move down a level and the title is dropped, so that the report
    sits inside the page's own "Results" section.
    """
    if not page.exists():
        return False
    current = page.read_text()
    if START not in current or END not in current:
        return False
    body = []
    for line in text.splitlines()[1:]:
        body.append("#" + line if line.startswith("##") else line)
    head, rest = current.split(START, 1)
    _, tail = rest.split(END, 1)
    page.write_text(head + START + "\n" + "\n".join(body).strip() + "\n" + END + tail)
    return True


def _median_of(runs: int) -> str:
    return f", median of {runs} runs" if runs > 1 else ""

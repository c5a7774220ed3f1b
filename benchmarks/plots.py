"""PNG plots of a run (matplotlib, Agg backend), for docs/performance.md."""

from __future__ import annotations

from pathlib import Path

from .core import pct

DISTLOCK_COLOR = "#1f77b4"
PEER_COLOR = "#9e9e9e"
FLOOR_COLOR = "#2ca02c"


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _color(name: str, floor: str) -> str:
    if name == floor:
        return FLOOR_COLOR
    return DISTLOCK_COLOR if "django_distlock" in name else PEER_COLOR


def ratio_bars(block: dict, title: str, path: Path, target: float | None) -> Path:
    """Horizontal bars: p50 as a multiple of the floor; a diamond marks p99."""
    plt = _plt()
    s = block["series"]
    floor = s[block["floor"]].p(50)
    names = list(s)[::-1]
    p50 = [s[n].p(50) / floor for n in names]
    p99 = [s[n].p(99) / floor for n in names]
    fig, ax = plt.subplots(figsize=(10, 0.42 * len(names) + 1.7))
    colors = [
        FLOOR_COLOR
        if "floor" in n or "reference" in n or n == block["floor"]
        else _color(n, "")
        for n in names
    ]
    ax.barh(names, p50, color=colors, height=0.65)
    ax.scatter(p99, names, marker="D", s=14, color="black", zorder=3, label="p99")
    for y, (v, n) in enumerate(zip(p50, names)):
        ax.text(
            v * 1.03,
            y,
            f"{v:.2f}x ({s[n].p(50):.0f} µs)",
            va="center",
            fontsize=8,
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1},
        )
    if target:
        ax.axvline(target, color="red", ls="--", lw=1, label=f"target {target}x")
    ax.axvline(1.0, color=FLOOR_COLOR, lw=0.8)
    ax.set_xscale("log")
    ax.set_xlim(min(0.7, min(p50) * 0.6), max(p99 + p50) * 1.6)
    ax.set_xlabel("cycle time as a multiple of the floor's p50 (log scale)")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(True, axis="x", which="both", alpha=0.2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def contended_plot(block: dict, path: Path) -> Path:
    """Left: cycles/s and holder-changed share. Right: CDF of the waits."""
    plt = _plt()
    o = block["outcomes"]
    names = list(o)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    colors = [_color(n, "") for n in names]
    rev = names[::-1]
    ax1.barh(rev, [o[n].cycles_per_s for n in rev], color=colors[::-1])
    for y, n in enumerate(rev):
        ax1.text(
            o[n].cycles_per_s,
            y,
            f" {o[n].cycles_per_s:.0f}/s, holder changed {o[n].changed_share:.0%}",
            va="center",
            fontsize=8,
        )
    ax1.set_xlabel("cycles per second, 4 processes, one lock")
    ax1.margins(x=0.6)
    ax1.set_title("Throughput (and share of handoffs to another worker)")
    for n in names:
        waits = sorted(max(w, 1e-3) for w in o[n].waits_ms)
        if not waits:
            continue
        total = len(waits)
        # Share of acquisitions that waited at least x: the tail stays visible.
        ys = [(total - i) / total for i in range(total)]
        mine = "django_distlock" in n
        ax2.step(
            waits,
            ys,
            where="post",
            label=n,
            ls="-" if mine else "--",
            lw=2.2 if mine else 1.2,
        )
    ax2.axvline(20, color="red", ls=":", lw=1)
    ax2.text(20, 0.5, " 20 ms: target\n for the longest wait", color="red", fontsize=8)
    ax2.set_xscale("log")
    ax2.set_yscale("log")
    ax2.set_xlabel("wait for the lock, ms (log scale)")
    ax2.set_ylabel("share of acquisitions that waited at least that long")
    ax2.set_title("Waits: the tail (log-log)")
    ax2.legend(fontsize=8, loc="lower left")
    ax2.grid(True, which="both", alpha=0.2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def memory_plot(block: dict, path: Path) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 2.4))
    names = ["bare SET NX PX key", "django_distlock lease"]
    values = [block["bare_bytes"], block["distlock_bytes"]]
    ax.barh(names, values, color=[FLOOR_COLOR, DISTLOCK_COLOR])
    ax.axvline(3 * block["bare_bytes"], color="red", ls="--", lw=1)
    ax.text(3 * block["bare_bytes"], 1.35, " target: 3x bare", color="red", fontsize=8)
    for y, v in enumerate(values):
        ax.text(v, y, f" {v:.0f} B", va="center", fontsize=9)
    ax.set_xlabel(f"Redis memory per held lock ({block['count']:,} locks)")
    ax.margins(x=0.25)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def kinds_plot(block: dict, path: Path) -> Path:
    """Left: each target's p50 ratio (per-round 10-90% as a whisker, the
    target as a red tick). Right: 8 processes, cycles/s of each kind."""
    from .core import ratio_of

    plt = _plt()
    contended = block.get("contended", {})
    fig, (ax1, ax2) = plt.subplots(
        1, 2, figsize=(13, 5.6), gridspec_kw={"width_ratios": [3, 2]}
    )
    labels, ratios, lows, highs, limits = [], [], [], [], []
    for backend, b in block["backends"].items():
        s = b["series"]
        for name, (ref, limit) in b["targets"].items():
            if name not in s or ref not in s:
                continue
            pooled, lo, hi = ratio_of(s[name], s[ref])
            labels.append(f"{backend}: {name}\n÷ {ref}")
            ratios.append(pooled)
            lows.append(max(pooled - lo, 0))
            highs.append(max(hi - pooled, 0))
            limits.append(limit)
    ys = list(range(len(labels)))[::-1]
    ax1.barh(ys, ratios, xerr=[lows, highs], color=DISTLOCK_COLOR, height=0.6)
    for y, v, hi, limit in zip(ys, ratios, highs, limits):
        ax1.text(v + hi, y, f"  {v:.2f}x", va="center", fontsize=8)
        if limit:
            ax1.plot([limit, limit], [y - 0.35, y + 0.35], color="red", lw=2)
    ax1.set_yticks(ys, labels, fontsize=8)
    ax1.axvline(1.0, color=FLOOR_COLOR, lw=0.8)
    ax1.set_xlabel("p50 cycle time ratio (red: target; whisker: per-round 10-90%)")
    ax1.set_title("Uncontended cycle by kind")
    names, values = [], []
    for backend, outcomes in contended.items():
        for kind, o in outcomes.items():
            names.append(f"{backend}: {kind}")
            values.append(o.cycles_per_s)
    if names:
        rev = names[::-1]
        ax2.barh(rev, values[::-1], color=DISTLOCK_COLOR)
        for y, v in enumerate(values[::-1]):
            ax2.text(v, y, f" {v:.0f}/s", va="center", fontsize=8)
        ax2.margins(x=0.3)
        ax2.set_xlabel("cycles per second (8 processes, 1 ms held)")
        ax2.set_title("Limit-3 semaphore vs exclusive lock")
    else:
        ax2.set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_all(results: dict, out: Path) -> list[Path]:
    written = []
    if "uncontended" in results:
        written.append(
            ratio_bars(
                results["uncontended"],
                "Uncontended acquire + release on one Redis",
                out / "bench_uncontended.png",
                1.10,
            )
        )
    if "contended" in results:
        written.append(
            contended_plot(results["contended"], out / "bench_contended.png")
        )
    if "redlock" in results:
        written.append(
            ratio_bars(
                results["redlock"],
                "Redlock on 5 redis-server processes (floor: raw fan-out)",
                out / "bench_redlock.png",
                1.2,
            )
        )
    if "database" in results:
        written.append(
            ratio_bars(
                results["database"],
                "PostgreSQL, uncontended cycle (floor: advisory lock pair)",
                out / "bench_database.png",
                3.0,
            )
        )
    if "kinds" in results:
        written.append(kinds_plot(results["kinds"], out / "bench_kinds.png"))
    if "scale" in results:
        written.append(memory_plot(results["scale"], out / "bench_memory.png"))
    return written


__all__ = ["pct", "write_all"]

"""The plan's Pareto plot (matplotlib, files only): goodput per GPU against ITL P99 for every simulated
layout, by kind, the Pareto front (no other layout has more goodput and a lower ITL P99) joined, and the
recommended layout marked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"colocated": "tab:red", "disagg": "tab:blue", "hybrid": "tab:purple"}


def front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The Pareto front of (ITL P99, goodput) points: lower ITL and higher goodput are better."""
    best: list[tuple[float, float]] = []
    for itl, good in sorted(points, key=lambda p: (p[0], -p[1])):
        if not best or good > best[-1][1]:
            best.append((itl, good))
    return best


def pareto(doc: dict[str, Any], out: Path) -> Path:
    """pareto.png in `out`."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    pts: list[tuple[float, float]] = []
    for kind, color in COLORS.items():
        rows = [r for r in doc["layouts"] if r["kind"] == kind]
        xy = [(r["p99_itl_ms"], r["request_goodput_per_gpu"]) for r in rows]
        xy = [(x, y) for x, y in xy if x is not None and y is not None]
        pts += xy
        if xy:
            ax.scatter([x for x, _ in xy], [y for _, y in xy], s=18, color=color, label=kind)
    line = front(pts)
    if line:
        ax.plot([x for x, _ in line], [y for _, y in line], "k--", lw=0.8, label="Pareto front")
    rec = next((r for r in doc["layouts"] if r["layout"] == doc["recommended"]), None)
    if rec and rec["p99_itl_ms"] is not None and rec["request_goodput_per_gpu"] is not None:
        ax.scatter(
            [rec["p99_itl_ms"]],
            [rec["request_goodput_per_gpu"]],
            s=160,
            marker="*",
            color="gold",
            edgecolors="k",
            zorder=5,
            label=f"recommended: {rec['layout']}",
        )
    ax.axvline(doc["targets"]["itl_p99_ms"], color="gray", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_xlabel("ITL P99 (ms, log; dotted: the target)")
    ax.set_ylabel("goodput (requests/s meeting the SLO) per GPU")
    ax.set_title("predicted layouts: goodput per GPU against ITL P99", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / "pareto.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path

"""The bench report's PNG plots (matplotlib, no display): TTFT and ITL CDFs per pool and class, an ITL
timeline around a long prompt's arrival, per-class bars, and the server-side chain per pool."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: never a window, works without a display
import matplotlib.pyplot as plt  # noqa: E402

from pdfleet.bench.compare import BenchResult  # noqa: E402
from pdfleet.bench.stats import gaps  # noqa: E402

COLORS = {"colocated": "tab:red", "disagg": "tab:blue", "routed": "tab:purple"}
STYLES = {"short": "-", "long": "--"}


def _cdf(ax: Any, xs: list[float], label: str, color: str, style: str) -> None:
    """One empirical CDF curve."""
    if not xs:
        return
    xs = sorted(xs)
    ys = [(i + 1) / len(xs) for i in range(len(xs))]
    ax.plot(xs, ys, style, color=color, label=f"{label} (n={len(xs)})")


def _save(fig: Any, path: Path) -> Path:
    """Write a figure as PNG and free it."""
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def cdfs(result: BenchResult, out: Path) -> list[Path]:
    """ttft_cdf.png and itl_cdf.png: one curve per pool and length class (ms, ITL on a log axis)."""
    s = result.plan.time_scale
    paths = []
    for metric in ("ttft", "itl"):
        fig, ax = plt.subplots(figsize=(7, 4))
        for pool, res in result.pools.items():
            if res.run is None:
                continue
            for cls in ("short", "long"):
                done = [r for r in res.run.records if r.success and r.length_class == cls]
                xs = (
                    [1000 * r.ttft / s for r in done]
                    if metric == "ttft"
                    else [1000 * g for r in done for g in gaps(r, s)]
                )
                _cdf(ax, xs, f"{pool} {cls}", COLORS.get(pool, "gray"), STYLES[cls])
        ax.set_xlabel(f"{metric.upper()} (ms)")
        ax.set_ylabel("share of " + ("requests" if metric == "ttft" else "gaps"))
        if metric == "itl":
            ax.set_xscale("log")
            ax.axvline(result.plan.bounds.stall_ms, color="k", lw=0.8, ls=":", label="stall threshold")
        ax.set_title(f"{metric.upper()} CDF per pool and length class")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        paths.append(_save(fig, out / f"{metric}_cdf.png"))
    return paths


def _short_gaps(run: Any, s: float) -> list[tuple[float, float]]:
    """(time since the run began, gap ms) of every short stream's inter-token gap."""
    out = []
    for r in run.records:
        if r.length_class == "short" and r.chunks:
            out += [((t - run.t0) / s, 1000 * g) for t, g in zip(r.chunks[1:], gaps(r, s), strict=False)]
    return out


def timeline(result: BenchResult, out: Path, window_s: float = 12.0) -> Path:
    """itl_timeline.png: short streams' gaps against time, one panel per pool, around the colocated pool's
    longest gap (the same window for every pool); long prompts' starts as dashed lines, the stall threshold
    dotted. A stall shows as a spike just after a long prompt lands."""
    s = result.plan.time_scale
    runs = [(p, r.run) for p, r in result.pools.items() if r.run is not None]
    points = {p: _short_gaps(run, s) for p, run in runs}
    ref = points.get("colocated") or next(iter(points.values()), [])
    worst = max(ref, key=lambda xy: xy[1])[0] if ref else 0.0
    lo, hi = max(0.0, worst - window_s / 3), max(0.0, worst - window_s / 3) + window_s
    fig, axes = plt.subplots(len(runs) or 1, 1, figsize=(8, 2.6 * max(1, len(runs))), squeeze=False)
    for ax, (pool, run) in zip(axes[:, 0], runs, strict=False):
        shown = [(x, y) for x, y in points[pool] if lo <= x <= hi]
        ax.scatter(
            [x for x, _ in shown],
            [y for _, y in shown],
            s=2,
            color=COLORS.get(pool, "gray"),
            label=f"{pool}: short streams' gaps",
        )
        for r in run.records:
            t = (r.start - run.t0) / s
            if r.length_class == "long" and math.isfinite(t) and lo <= t <= hi:
                ax.axvline(t, color="k", lw=0.8, ls="--")
        ax.axhline(result.plan.bounds.stall_ms, color="gray", lw=0.8, ls=":")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylabel("ITL (ms)")
        ax.set_title(f"{pool}: inter-token gaps of short streams; dashed: a long prompt arrives", fontsize=9)
        ax.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("time since the run started (s)")
    return _save(fig, out / "itl_timeline.png")


def class_bars(summaries: dict[str, dict[str, Any]], out: Path) -> Path:
    """class_bars.png: TTFT P95, ITL P99 and stalls per 100 streams per pool and length class."""
    panels = (
        ("p95_ttft_ms", "TTFT P95 (ms)"),
        ("p99_itl_ms", "ITL P99 (ms)"),
        ("stalls_per_100_streams", "stalls / 100 streams"),
    )
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.4))
    pools = [p for p, s in summaries.items() if "error" not in s]
    for ax, (key, title) in zip(axes, panels, strict=False):
        for i, cls in enumerate(("short", "long")):
            for j, pool in enumerate(pools):
                v = summaries[pool]["pdfleet"]["classes"].get(cls, {}).get(key)
                v = v if isinstance(v, int | float) and math.isfinite(v) else 0.0
                ax.bar(
                    i * (len(pools) + 1) + j,
                    v,
                    color=COLORS.get(pool, "gray"),
                    label=pool if i == 0 else None,
                )
        ax.set_xticks([(len(pools) - 1) / 2 + i * (len(pools) + 1) for i in range(2)], ["short", "long"])
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    return _save(fig, out / "class_bars.png")


def server_chain(summaries: dict[str, dict[str, Any]], out: Path) -> Path:
    """server_chain.png: P95 of queue, prefill, KV transfer and decode per pool and role (server side)."""
    stages = ("queue", "prefill", "kv_transfer", "decode")
    fig, ax = plt.subplots(figsize=(8, 3.4))
    labels: list[str] = []
    x = 0
    for pool, s in summaries.items():
        if "error" in s:
            continue
        server = s["pdfleet"]["server"]
        roles = sorted(
            {
                r
                for st in stages
                for r, v in server.get(f"{st}_p95_ms", {}).items()
                if isinstance(v, int | float)
            }
        )
        for role in roles:
            bottom = 0.0
            for k, st in enumerate(stages):
                v = server.get(f"{st}_p95_ms", {}).get(role)
                if isinstance(v, int | float):
                    ax.bar(x, v, bottom=bottom, color=plt.cm.tab10(k), label=st if not labels else None)
                    bottom += v
            labels.append(f"{pool}\n{role}")
            x += 1
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylabel("P95 per stage (ms, stacked)")
    ax.set_title("server side: the request chain per pool and role (vLLM histograms)", fontsize=10)
    if labels:
        ax.legend(fontsize=8)
    return _save(fig, out / "server_chain.png")


def all_plots(result: BenchResult, summaries: dict[str, dict[str, Any]], out: Path) -> list[Path]:
    """Every plot of the report, written into `out`."""
    return [
        *cdfs(result, out),
        timeline(result, out),
        class_bars(summaries, out),
        server_chain(summaries, out),
    ]

"""Where a pool's ITL comes from, pure: the model's gaps, the lab instances' own (their simulated-time ITL
histogram over the run, from /metrics snapshots before and after it), how late their steps' tokens left in
wall time, and the client's gaps — so that the machine's delivery jitter is not read as the model's error
(`invoke plan --validate`, bench/plan_fidelity.py; docs/plan.md's Fidelity).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pdfleet.metrics.source import bucket_quantile

GAP_MS = 10.0  # vLLM's ITL histogram's first bound: the finest split the instances' own figures allow
BUNCHED_MS = 1.0  # a gap this short is two tokens the client read at once
SAME_SHARE_POINTS = 1.0  # the instances' share of gaps over GAP_MS within this many points of the model's
SAME_MEAN_PCT = 2.0  # and their mean gap within this share of it: the engines did what the model says
TTFT = "vllm:time_to_first_token_seconds"
SAME_TTFT_PCT = 10.0  # the colocated instances' own mean TTFT within this share of the model's
KEPT = (
    "vllm:inter_token_latency_seconds",
    "pdfleet_sim_step_lag",
    "pdfleet_sim_loop_lag",
    TTFT,
)  # snapshotted

Deltas = dict[tuple[str, str, str], dict[str, float]]


def _key(sample: Mapping[str, Any]) -> tuple[str, str, str, str, str]:
    labels = sample["labels"]
    name, _, part = str(sample["name"]).rpartition("_")
    return (
        name,
        labels.get("pool", ""),
        labels.get("role", ""),
        labels.get("host", ""),
        labels.get("le", part),
    )


def deltas(before: Iterable[Mapping[str, Any]], after: Iterable[Mapping[str, Any]]) -> Deltas:
    """The instances' histograms over a run, summed over hosts: (metric, pool, role) -> {le or "sum" or
    "count": increase}, from two snapshots' samples ({"name", "labels", "value"})."""
    start = {_key(x): float(x["value"]) for x in before}
    out: Deltas = {}
    for x in after:
        key = _key(x)
        name, pool, role, _, part = key
        into = out.setdefault((name, pool, role), {})
        into[part] = into.get(part, 0.0) + float(x["value"]) - start.get(key, 0.0)
    return out


def hist_quantile(h: Mapping[str, float], q: float) -> float:
    """A quantile of a histogram delta (its "le" buckets)."""
    return bucket_quantile(q, [(float(le), c) for le, c in h.items() if le not in ("sum", "count")])


def gap_shares(records: Iterable[Sequence[float]]) -> tuple[float, float, float]:
    """Pooled gaps (s) of many streams: % over GAP_MS, % under BUNCHED_MS (tokens read at once), mean ms."""
    xs = [g for gs in records for g in gs]
    if not xs:
        return math.nan, math.nan, math.nan
    over = 100 * sum(g > GAP_MS / 1000 for g in xs) / len(xs)
    under = 100 * sum(g < BUNCHED_MS / 1000 for g in xs) / len(xs)
    return over, under, 1000 * sum(xs) / len(xs)


def component_lines(
    pool: str,
    predicted: Iterable[Sequence[float]],
    lab: Deltas,
    client: Iterable[Sequence[float]],
    label: str | None = None,
) -> list[str]:
    """The pool's gaps: predicted (per stream, s), the lab instances' own (empty `lab`: no snapshots), the
    client's (per stream, s); `label` heads the lines (default: the pool)."""
    pred = gap_shares(predicted)
    head = label or pool
    lines = [f"{head:10} gaps over {GAP_MS:g} ms / mean: predicted {pred[0]:.1f}% / {pred[2]:.2f} ms"]
    own: tuple[float, float, float] | None = None  # (count, share over GAP_MS, mean ms) of the busiest role
    for role in sorted({role for (_, p, role) in lab if p == pool}):
        itl = lab.get(("vllm:inter_token_latency_seconds", pool, role), {})
        lag = lab.get(("pdfleet_sim_step_lag_seconds", pool, role), {})
        if itl.get("count"):
            over = 100 * (1 - itl.get(f"{GAP_MS / 1000:g}", math.nan) / itl["count"])
            mean = 1000 * itl["sum"] / itl["count"]
            lines.append(f"{'':10} lab {role} instances' own gaps (simulated): {over:.1f}% / {mean:.2f} ms")
            if own is None or itl["count"] > own[0]:
                own = (itl["count"], over, mean)
        if lag.get("count"):
            p50, p95, p99 = (1000 * hist_quantile(lag, q) for q in (0.5, 0.95, 0.99))
            late = f"P50 {p50:.1f}, P95 {p95:.1f}, P99 {p99:.1f} ms"
            lines.append(f"{'':10} lab {role} steps' tokens late (wall): {late}")
    seen = gap_shares(client)
    lines.append(
        f"{'':10} lab client gaps: {seen[0]:.1f}% / {seen[2]:.2f} ms; under {BUNCHED_MS:g} ms "
        f"(tokens read together): {seen[1]:.1f}%"
    )
    if own is not None:
        lines.append(f"{'':10} {engines_verdict(pred[0], pred[2], own[1], own[2])}")
    return lines


def engines_verdict(pred_over: float, pred_mean: float, own_over: float, own_mean: float) -> str:
    """Whether the lab's engines made the gaps the model predicts (then an ITL error at the client is
    delivery: the machine's, not the model's)."""
    same = (
        abs(own_over - pred_over) <= SAME_SHARE_POINTS
        and own_mean > 0
        and 100 * abs(pred_mean - own_mean) / own_mean <= SAME_MEAN_PCT
    )
    if same:
        return (
            "the instances made the predicted gaps: an ITL difference at the client is delivery jitter "
            "(the machine), not the model"
        )
    return (
        f"the instances' own gaps differ from the model's (over {SAME_SHARE_POINTS:g} point or "
        f"{SAME_MEAN_PCT:g}% of the mean): the model, not only delivery"
    )


def _mean_ms(xs: Sequence[float]) -> float:
    return 1000 * sum(xs) / len(xs) if xs else math.nan


def ttft_lines(
    pool: str, predicted: Sequence[float], lab: Deltas, client: Sequence[float], label: str | None = None
) -> list[str]:
    """The pool's mean TTFT (s in, ms out): predicted, each role's instances' own (simulated: their
    histogram's sum over count, warm-ups included), the client's; for colocated instances, whether their
    first tokens came when the model says (then a TTFT difference at the client is the request's path:
    gateway, TLS, network, client, which the model leaves out)."""
    pred, seen = _mean_ms(predicted), _mean_ms(client)
    head = label or pool
    lines = [f"{head:10} TTFT mean: predicted {pred:.1f} ms, lab client {seen:.1f} ms"]
    for role in sorted({role for (name, p, role) in lab if p == pool and name == TTFT}):
        h = lab[(TTFT, pool, role)]
        if not h.get("count"):
            continue
        own = 1000 * h["sum"] / h["count"]
        lines.append(f"{'':10} lab {role} instances' own TTFT mean (simulated): {own:.1f} ms")
        if role == "colocated" and pred > 0:
            lines.append(f"{'':10} {_ttft_verdict(pred, own, seen)}")
    return lines


def _ttft_verdict(pred: float, own: float, seen: float) -> str:
    """Whether the colocated instances' own mean TTFT is the model's (ms each)."""
    if 100 * abs(own - pred) / pred <= SAME_TTFT_PCT:
        return (
            f"the instances' first tokens came when the model says: the client's {seen - own:+.1f} ms is the "
            "request's path (gateway, TLS, network, client), not the model"
        )
    return f"the instances' own TTFT differs from the model's by over {SAME_TTFT_PCT:g}%: the model"

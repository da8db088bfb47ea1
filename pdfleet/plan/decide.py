"""The plan's decision as a pure function of the predictions (like bench/verdict.py and rollout/gates.py):
the ranked table with the reason each layout loses, the recommendation and why, and the guide's verdict.

Ranking: layouts that meet every target first (TTFT P95, TPOT P95, ITL P99, KV transfer P99 where KV
moves, SLO attainment), then by goodput per GPU in steps of 1% of the best (closer than that is the
simulation's noise, not a difference), then by ITL P99. A layout loses on the targets it misses (the
largest miss first), else on goodput or ITL against the layout above it.

Recommendation: the guide's rule (`bench.verdict.decide`) on the best colocated-only layout against the
best layout with a P/D pool. `split` recommends that P/D layout; anything else keeps the best
colocated-only layout, with the verdict's headline as the reason — and, when no prompt reaches the
smallest threshold searched, says there is nothing for a prefill pool to take off the colocated
instances.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from pdfleet.bench.verdict import PoolFigures, Thresholds, Verdict, decide
from pdfleet.plan.predict import Prediction


@dataclass(frozen=True)
class Targets:
    """What a layout must meet (the profile's slo: the verdict's P95 bounds and the rollout's P99s)."""

    ttft_p95_ms: float
    tpot_p95_ms: float
    itl_p99_ms: float
    kv_transfer_p99_ms: float
    attainment_pct: float
    prefill_queue_p95_ms: float = 500.0
    decode_queue_p95_ms: float = 500.0

    @property
    def thresholds(self) -> Thresholds:
        return Thresholds(
            self.ttft_p95_ms, self.tpot_p95_ms, self.prefill_queue_p95_ms, self.decode_queue_p95_ms
        )


@dataclass(frozen=True)
class Miss:
    """A target a layout misses: name, predicted, bound (attainment: a floor, the rest ceilings)."""

    what: str
    value: float
    bound: float

    @property
    def by_pct(self) -> float:
        """How far past the bound, as a share of it (positive)."""
        return 100 * abs(self.value - self.bound) / self.bound

    def __str__(self) -> str:
        unit = "%" if self.what == "SLO attainment" else " ms"
        cmp = "<" if self.what == "SLO attainment" else ">"
        return f"{self.what} {self.value:.1f}{unit} {cmp} {self.bound:g}{unit} (by {self.by_pct:.0f}%)"


@dataclass(frozen=True)
class Row:
    """One ranked layout: its prediction, the targets it misses, and why it is not first."""

    rank: int
    prediction: Prediction
    misses: tuple[Miss, ...]
    loses: str


@dataclass
class Decision:
    """The ranked table, the recommended row, why, and the guide's verdict on the two best kinds."""

    rows: list[Row]
    recommended: Row | None
    why: list[str] = field(default_factory=list)
    verdict: Verdict | None = None


def misses(p: Prediction, t: Targets) -> tuple[Miss, ...]:
    """Every target the prediction misses, the largest miss first (NaN counts as missed: nothing done)."""
    found: list[Miss] = []
    checks = [
        ("TTFT P95", p.figure("p95_ttft_ms"), t.ttft_p95_ms),
        ("TPOT P95", p.figure("p95_tpot_ms"), t.tpot_p95_ms),
        ("ITL P99", p.figure("p99_itl_ms"), t.itl_p99_ms),
    ]
    if "kv_transfer_p99_ms" in p.kv:
        checks.append(("KV transfer P99", p.kv["kv_transfer_p99_ms"], t.kv_transfer_p99_ms))
    for what, value, bound in checks:
        if not value <= bound:  # NaN: not measured, counted as missed
            found.append(Miss(what, value, bound))
    att = p.figure("slo_attainment_pct")
    if not att >= t.attainment_pct:
        found.append(Miss("SLO attainment", att, t.attainment_pct))
    return tuple(sorted(found, key=lambda m: -m.by_pct if math.isfinite(m.by_pct) else -math.inf))


GOODPUT_STEP = 0.01  # goodputs within 1% of the best's count as equal


def _goodput(p: Prediction) -> float:
    g = p.per_gpu.get("request_goodput_per_gpu", math.nan)
    return g if math.isfinite(g) else 0.0


def _key(p: Prediction, t: Targets, best: float) -> tuple[int, int, float]:
    """Sort key: meets everything first, then goodput per GPU (high first, in 1% steps of the best),
    then ITL P99 (low first)."""
    itl = p.figure("p99_itl_ms")
    step = round(_goodput(p) / best / GOODPUT_STEP) if best > 0 else 0
    return (1 if misses(p, t) else 0, -step, itl if math.isfinite(itl) else math.inf)


def _loses(p: Prediction, m: tuple[Miss, ...], above: Prediction | None, best: float) -> str:
    """Why this row is not the one above it: its misses, else goodput, else ITL."""
    if m:
        return "misses " + "; ".join(str(x) for x in m)
    if above is None:
        return "-"
    g, g0 = _goodput(p), _goodput(above)
    if best > 0 and round(g / best / GOODPUT_STEP) < round(g0 / best / GOODPUT_STEP):
        return f"goodput {g:.3f}/s per GPU < {g0:.3f} ({100 * (g - g0) / g0:.1f}%)"
    return (
        f"same goodput (within 1%); ITL P99 {p.figure('p99_itl_ms'):.1f} ms >= "
        f"{above.figure('p99_itl_ms'):.1f} ms"
    )


def rank(predictions: Sequence[Prediction], t: Targets) -> list[Row]:
    """The ranked table."""
    best = max((_goodput(p) for p in predictions), default=0.0)
    ordered = sorted(predictions, key=lambda p: _key(p, t, best))
    rows: list[Row] = []
    for i, p in enumerate(ordered):
        m = misses(p, t)
        rows.append(Row(i + 1, p, m, _loses(p, m, ordered[i - 1] if i else None, best)))
    return rows


def figures(p: Prediction) -> PoolFigures:
    """What the guide's rule reads of a predicted layout."""
    return PoolFigures(
        ttft_p95_ms=_finite(p.figure("p95_ttft_ms")),
        tpot_p95_ms=_finite(p.figure("p95_tpot_ms")),
        prefill_queue_p95_ms=_finite(p.queues_ms.get("prefill_queue_p95_ms", math.nan)),
        decode_queue_p95_ms=_finite(p.queues_ms.get("decode_queue_p95_ms", math.nan)),
        kv_transfer_p95_ms=_finite(p.kv.get("kv_transfer_p95_ms", math.nan)),
        failed=int(p.figure("failed")) if math.isfinite(p.figure("failed")) else 0,
    )


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None


def choose(
    predictions: Sequence[Prediction], t: Targets, longest_effective: int, smallest_threshold: int
) -> Decision:
    """Rank, apply the guide's rule to the best of each kind, recommend (module docstring)."""
    rows = rank(predictions, t)
    colo = next((r for r in rows if r.prediction.layout.kind == "colocated"), None)
    split = next((r for r in rows if r.prediction.layout.kind != "colocated"), None)
    if colo is None:
        best = rows[0] if rows else None
        why = ["no colocated-only layout was simulated (every one was cut): the best remaining layout"]
        return Decision(rows, best, why, None)
    verdict = decide(figures(colo.prediction), figures(split.prediction) if split else None, t.thresholds)
    if verdict.decision == "split" and split is not None:
        why = [
            f"the guide's rule on the best colocated-only layout ({colo.prediction.layout.name}) against "
            f"the best with a P/D pool: {verdict.headline}"
        ]
        return Decision(rows, split, why, verdict)
    why = []
    if longest_effective < smallest_threshold:
        why.append(
            f"colocated only: no prompt reaches {smallest_threshold} effective tokens (the longest has "
            f"{longest_effective}), so a prefill pool has no long prefill to take off the colocated "
            "instances; P/D would only add a KV transfer per request and split the GPUs"
        )
    why.append(f"the guide's rule on the best colocated-only layout: {verdict.headline}")
    return Decision(rows, colo, why, verdict)

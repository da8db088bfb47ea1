"""`invoke plan --validate` and bench/plan_fidelity.py, pure: which of the plan's best layouts the fleet can
measure as it stands, and the prediction against what `invoke bench` measured on the same requests.

A layout is measurable when the fleet serves it as it stands: one of its pools (the bench's colocated run,
or its P/D run taking every request: the same instances, TP and token budget per role), or, for a hybrid
(P/D for the long prompts, colocated for the rest), the fleet's whole layout with the gateway's threshold
on it (the bench's routed run: the gateway's own routing, long prompts to P/D). Any other shape is skipped
with what would make it measurable: host moves (other pool counts) or a profile change (TP, budget,
threshold).

The bar (the issue's): TTFT and ITL P95 per length class within 15% of the measurement, and the ranking of
the two measured layouts by the plan's rule the same on both. ITL P50 and TPOT P95 are shown beside them,
not judged.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pdfleet.plan.decide import Targets, rank
from pdfleet.plan.predict import Prediction
from pdfleet.plan.space import Layout, PoolShape

BAR_PCT = 15.0
FIGURES = (("p95_ttft_ms", "TTFT P95"), ("p95_itl_ms", "ITL P95"))  # the bar
CONTEXT = (("median_itl_ms", "ITL P50"), ("p95_tpot_ms", "TPOT P95"))  # shown beside it, not judged
CLASSES = ("short", "long")
MEASURED = 2  # the "top two"


def pool_layouts(pools: Mapping[str, PoolShape | None], threshold: int | None = None) -> dict[str, Layout]:
    """The fleet's bench runs as layouts: the colocated pool alone; the P/D pool taking every request; and
    with a `threshold` (the gateway's), the whole fleet routed by it (`routed`: long prompts to P/D)."""
    out = {}
    colocated, prefill, decode = pools.get("colocated"), pools.get("prefill"), pools.get("decode")
    if colocated:
        out["colocated"] = Layout(colocated=colocated)
    if prefill and decode:
        out["disagg"] = Layout(None, prefill, decode)
        if colocated and threshold is not None:
            out["routed"] = Layout(colocated, prefill, decode, threshold)
    return out


@dataclass(frozen=True)
class Pick:
    """A ranked layout and how --validate takes it: the bench run that is it, or why it is skipped."""

    rank: int
    layout: Layout
    pool: str | None
    skipped: str | None = None


Shares = Mapping[int, tuple[float, float]]  # threshold -> (share of the requests it sends to P/D, their mean)


def same_layout(a: Layout, b: Layout, shares: Shares) -> bool:
    """The same layout, or hybrids of the same pools whose thresholds route the same requests of the plan's
    traffic (`shares`: plan.space.Load.long; the search keeps the lowest of such twins only)."""
    if a == b:
        return True
    pools = (a.colocated, a.prefill, a.decode) == (b.colocated, b.prefill, b.decode)
    if not pools or a.kind != "hybrid":
        return False
    ta, tb = a.threshold, b.threshold
    return ta is not None and tb is not None and ta in shares and tb in shares and shares[ta] == shares[tb]


def pick(
    ranked: Sequence[Layout], fleet: Mapping[str, Layout], want: int = MEASURED, shares: Shares | None = None
) -> list[Pick]:
    """The best `want` layouts the fleet serves as it stands (`shares`: a hybrid whose threshold routes the
    same requests as the fleet's is the fleet's), and every layout ranked above the last of them with why
    it is skipped (with none measurable: the first `want`, skipped)."""
    out: list[Pick] = []
    for n, layout in enumerate(ranked, 1):
        if sum(p.pool is not None for p in out) == want:
            break
        pool = next((name for name, have in fleet.items() if same_layout(layout, have, shares or {})), None)
        out.append(Pick(n, layout, pool, None if pool else _why_not(layout, fleet)))
    last = max((i for i, p in enumerate(out) if p.pool is not None), default=want - 1)
    return out[: last + 1]


def _why_not(layout: Layout, fleet: Mapping[str, Layout]) -> str:
    """What keeps the fleet from serving `layout` as it stands, and what would make it measurable."""
    kinds = {"colocated": "colocated", "disagg": "disagg", "hybrid": "routed"}
    have = fleet.get(kinds[layout.kind])
    if have is None:
        pools = "; ".join(f"{pool} {lay.name}" for pool, lay in fleet.items()) or "none"
        return (
            f"the fleet has no {layout.kind} layout (its runs: {pools}): host moves or a profile change first"
        )
    moves, profile = _differences(layout, have)
    what = []
    if moves:
        what.append(f"host moves (`invoke rebalance --to-plan`: {', '.join(moves)})")
    if profile:
        what.append(f"a profile change and provision ({', '.join(profile)})")
    return f"the fleet's {kinds[layout.kind]} run is {have.name}: {' and '.join(what)} first"


def _differences(want: Layout, have: Layout) -> tuple[list[str], list[str]]:
    """(pool counts that differ: host moves; TP, budgets, threshold that differ: profile keys)."""
    moves, profile = [], []
    for role in ("colocated", "prefill", "decode"):
        a, b = getattr(want, role), getattr(have, role)
        if a is None or b is None:
            continue
        if a.instances != b.instances:
            moves.append(f"{role} {b.instances} -> {a.instances}")
        if a.tp != b.tp:
            profile.append(f"{role} TP {b.tp} -> {a.tp}")
        if a.budget != b.budget:
            profile.append(f"{role} max_num_batched_tokens {b.budget} -> {a.budget}")
    if want.threshold != have.threshold:
        profile.append(f"long_prompt_tokens {have.threshold} -> {want.threshold}")
    return moves, profile


def measured_prediction(layout: Layout, pool: Mapping[str, Any]) -> Prediction:
    """A bench pool's figures (results.json's pools.<pool>) in the planner's shape, to rank by its rule."""
    return Prediction(layout, dict(pool), pool["pdfleet"]["classes"], pool["pdfleet"]["per_gpu"], {}, {})


def err_pct(predicted: float, measured: float) -> float:
    """(predicted - measured) / measured in %; NaN when either is missing or the measurement is 0."""
    if not measured or not math.isfinite(measured) or not math.isfinite(predicted):
        return math.nan
    return 100 * (predicted - measured) / measured


@dataclass(frozen=True)
class Figure:
    """One figure of one class of one pool, predicted against measured; judged: one of the bar's."""

    pool: str
    cls: str
    name: str
    predicted: float
    measured: float
    judged: bool

    @property
    def err_pct(self) -> float:
        return err_pct(self.predicted, self.measured)

    @property
    def within(self) -> bool:
        """Within the bar (a missing figure is not)."""
        return math.isfinite(self.err_pct) and abs(self.err_pct) <= BAR_PCT


def figures(pool: str, pred: Prediction, measured_classes: Mapping[str, Mapping[str, Any]]) -> list[Figure]:
    """The bar's figures and the context beside them, per class, for one pool."""
    out = []
    for cls in CLASSES:
        for key, name in FIGURES + CONTEXT:
            p = _num(pred.classes.get(cls, {}).get(key))
            m = _num(measured_classes.get(cls, {}).get(key))
            out.append(Figure(pool, cls, name, p, m, (key, name) in FIGURES))
    return out


def _num(v: Any) -> float:
    return float(v) if isinstance(v, int | float) else math.nan


@dataclass(frozen=True)
class Validation:
    """The outcome: every figure, both rankings (pool names, best first) and the layouts skipped."""

    figures: tuple[Figure, ...]
    predicted_order: tuple[str, ...]
    measured_order: tuple[str, ...]
    skipped: tuple[Pick, ...] = ()

    @property
    def worst_pct(self) -> float:
        """The largest judged error (inf when a judged figure is missing; NaN with none)."""
        errs = [abs(f.err_pct) if math.isfinite(f.err_pct) else math.inf for f in self.figures if f.judged]
        return max(errs, default=math.nan)

    @property
    def within(self) -> bool:
        return bool(self.figures) and all(f.within for f in self.figures if f.judged)

    @property
    def ranking(self) -> str:
        """agree, disagree, or why the ranking was not checked."""
        if len(self.measured_order) < MEASURED:
            return f"not checked: {len(self.measured_order)} layout(s) measured, {MEASURED} needed"
        same = self.predicted_order[:MEASURED] == self.measured_order[:MEASURED]
        return "agree" if same else "disagree"


def validate(
    predicted: Mapping[str, Prediction],
    measured: Mapping[str, Mapping[str, Any]],
    targets: Targets,
    skipped: Sequence[Pick] = (),
) -> Validation:
    """Prediction against measurement for each pool measured (pool -> prediction, pool -> results.json's
    pool document; a pool whose bench run failed is left out of both rankings)."""
    pools = [p for p in predicted if p in measured and "error" not in measured[p]]
    figs = [f for p in pools for f in figures(p, predicted[p], measured[p]["pdfleet"]["classes"])]
    meas = {p: measured_prediction(predicted[p].layout, measured[p]) for p in pools}
    return Validation(
        tuple(figs),
        _order({p: predicted[p] for p in pools}, targets),
        _order(meas, targets),
        tuple(skipped),
    )


def _order(preds: Mapping[str, Prediction], targets: Targets) -> tuple[str, ...]:
    by_layout = {id(p): pool for pool, p in preds.items()}
    return tuple(by_layout[id(r.prediction)] for r in rank(list(preds.values()), targets))


def lines(v: Validation) -> list[str]:
    """The side-by-side table, the worst error against the bar, and the ranking's outcome."""
    out = [f"{'pool':10} {'class':6} {'figure':9} {'predicted':>10} {'measured':>10} {'error':>8}"]
    for f in v.figures:
        mark = "  outside the bar" if f.judged and not f.within else ""
        figs = f"{f.predicted:10.1f} {f.measured:10.1f} {f.err_pct:+7.1f}%"
        out.append(f"{f.pool:10} {f.cls:6} {f.name:9} {figs}{mark}")
    for p in v.skipped:
        out.append(f"skipped #{p.rank} {p.layout.name}: {p.skipped}")
    verdict = "within" if v.within else "NOT within"
    out.append(f"worst TTFT/ITL P95 error {v.worst_pct:.1f}% ({verdict} {BAR_PCT:g}%)")
    out.append(
        f"ranking predicted: {', '.join(v.predicted_order) or '-'}; measured: "
        f"{', '.join(v.measured_order) or '-'}: {v.ranking}"
    )
    return out

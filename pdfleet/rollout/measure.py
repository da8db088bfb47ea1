"""The gates' measurements through the one metrics client: per gated length class, the disaggregated
pool's figure and the colocated pool's (the baseline) over the window, and the sample count.

With a `model`, every figure is that model's alone (the gateway's series carry the model group as `model`,
vLLM's and the router's carry the model's name as `model`: the same value); without one, every model's
series are summed, as before models. Latencies come back in ms, error and fallback rates as fractions,
stalls per minute. A source that does
not answer or refuses a query is an error observation; an absent series is "no data" (None). Counters
that have never moved (no 5xx, no fallback, no stall yet) are absent too: with requests in the window
they count as zero.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from pdfleet.metrics.source import MetricsError, MetricsSource, SeriesAbsent
from pdfleet.model.rollout import CLASS_METRICS, GateSpec
from pdfleet.model.stages import StageSpec
from pdfleet.rollout.gates import Observation

REQUESTS = "pdfleet_gateway_requests_total"
# requests the gateway sent to a pool (a fallback still counts for the pool it was sent to first)
DECISIONS = "pdfleet_gateway_routing_decisions_total"
HISTOGRAMS = {
    "ttft": "pdfleet_gateway_ttft_seconds",
    "itl": "pdfleet_gateway_chunk_gap_seconds",
    "request": "pdfleet_gateway_request_duration_seconds",
    "tpot": "vllm:request_time_per_output_token_seconds",
    "kv_transfer": "vllm:nixl_xfer_time_seconds",
}
POOLS = ("disagg", "colocated")
KV_SERIES = (HISTOGRAMS["kv_transfer"], "decode")  # NixlConnector's: D pulls, D observes


def _match(cls: str | None, model: str | None) -> dict[str, str] | None:
    """The label matchers of a figure: its length class, its model (None: all)."""
    found = {k: v for k, v in (("length_class", cls), ("model", model)) if v is not None}
    return found or None


def _per_pool(
    source: MetricsSource,
    fn: str,
    name: str,
    window_s: float,
    cls: str | None,
    q: float = 0.0,
    model: str | None = None,
) -> dict[str, float | None]:
    """One figure per pool (None: no data); per class when the metric has the class label."""
    match = _match(cls, model)
    try:
        if fn == "quantile":
            got = source.quantile(q, name, window_s, by=("pool",), match=match)
        else:
            got = source.increase(name, window_s, by=("pool",), match=match)
    except SeriesAbsent:
        got = {}
    return {p: got.get((p,)) for p in POOLS}


def _vllm_quantile(
    source: MetricsSource,
    gate: GateSpec,
    window_s: float,
    model: str | None = None,
    kv: tuple[str, str] = KV_SERIES,
) -> dict[str, float | None]:
    """vLLM's own histograms: the disaggregated pool's decode instances, and the colocated pool; the KV
    transfer's on the role that observes it (`kv`: histogram and role, Mooncake's on prefill)."""
    out: dict[str, float | None] = {}
    mine = {"model": model} if model is not None else {}
    role = kv[1] if gate.metric == "kv_transfer" else "decode"
    pools = (
        ("disagg", {"pool": "disagg", "role": role, **mine}),
        ("colocated", {"pool": "colocated", **mine}),
    )
    histogram = kv[0] if gate.metric == "kv_transfer" else HISTOGRAMS[gate.metric]
    for pool, match in pools:
        if gate.metric == "kv_transfer" and pool == "colocated":
            out[pool] = None
            continue
        try:
            got = source.quantile(gate.quantile, histogram, window_s, match=match)
            out[pool] = got.get(())
        except SeriesAbsent:
            out[pool] = None
    return out


def _errors(source: MetricsSource, window_s: float, cls: str, model: str | None = None) -> dict[str, float]:
    """5xx answers per pool in the class (the source matches labels by equality: group by status)."""
    try:
        got = source.increase(REQUESTS, window_s, by=("pool", "status"), match=_match(cls, model))
    except SeriesAbsent:
        return {}
    out: dict[str, float] = {}
    for (pool, status), n in got.items():
        if status.startswith("5"):
            out[pool] = out.get(pool, 0.0) + n
    return out


def _ratio(num: float | None, den: float | None) -> float | None:
    if den is None or den <= 0:
        return None
    return (num or 0.0) / den


def figure(
    source: MetricsSource,
    gate: GateSpec,
    cls: str,
    window_s: float,
    model: str | None = None,
    kv: tuple[str, str] = KV_SERIES,
) -> dict[str, float | None]:
    """The gate's figure per pool, of one model or (None) of all (MetricsError when the source fails);
    a KV-transfer gate on `kv`'s histogram and role."""
    if gate.metric in ("ttft", "itl", "request"):
        got = _per_pool(source, "quantile", HISTOGRAMS[gate.metric], window_s, cls, gate.quantile, model)
        return {p: None if v is None else v * 1000.0 for p, v in got.items()}
    if gate.metric in ("tpot", "kv_transfer"):
        got = _vllm_quantile(source, gate, window_s, model, kv)
        return {p: None if v is None else v * 1000.0 for p, v in got.items()}
    requests = _per_pool(source, "increase", REQUESTS, window_s, cls, model=model)
    if gate.metric == "error_rate":
        errors = _errors(source, window_s, cls, model)
        return {p: _ratio(errors.get(p, 0.0), requests[p]) for p in POOLS}
    if gate.metric == "stalls":
        stalls = _per_pool(
            source, "increase", "pdfleet_gateway_stream_stalls_total", window_s, cls, model=model
        )
        return {p: None if requests[p] is None else (stalls[p] or 0.0) * 60.0 / window_s for p in POOLS}
    # fallback_rate: only the disaggregated pool falls back; per request of the class sent to it
    decisions = _per_pool(source, "increase", DECISIONS, window_s, cls, model=model)
    try:
        fallbacks = sum(
            source.increase("pdfleet_gateway_fallbacks_total", window_s, match=_match(cls, model)).values()
        )
    except SeriesAbsent:
        fallbacks = 0.0
    return {"disagg": _ratio(fallbacks, decisions["disagg"]), "colocated": None}


def observe(
    source: MetricsSource,
    gates: Sequence[GateSpec],
    weights: StageSpec,
    classes: Sequence[str],
    window_s: float,
    kv_transfer_metrics: bool = True,
    model: str | None = None,
    kv: tuple[str, str] = KV_SERIES,
) -> tuple[list[tuple[GateSpec, Observation]], int]:
    """Every gate's observation per gated class, and the requests routed to the disaggregated pool in
    those classes (the samples).

    Per-pool metrics (vLLM's) are measured once, under the first gated class. A KV transfer gate reads the
    connector's histogram on the role that observes it (`kv`); on a release without one it is left out.
    """
    out: list[tuple[GateSpec, Observation]] = []
    samples = 0
    for i, cls in enumerate(classes):
        weight = getattr(weights, cls)
        with contextlib.suppress(MetricsError):  # each gate below reports the error itself
            samples += int(
                _per_pool(source, "increase", DECISIONS, window_s, cls, model=model)["disagg"] or 0
            )
        for gate in gates:
            if gate.metric not in CLASS_METRICS and gate.metric != "fallback_rate" and i > 0:
                continue
            if gate.metric == "kv_transfer" and not kv_transfer_metrics:
                continue
            try:
                got = figure(source, gate, cls, window_s, model, kv)
            except MetricsError as exc:
                out.append((gate, Observation(gate.name, cls, weight=weight, error=str(exc))))
                continue
            out.append((gate, Observation(gate.name, cls, got["disagg"], got["colocated"], weight)))
    return out, samples

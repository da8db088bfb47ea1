"""What a layout would do with the traffic: its pools' engines driven by the discrete-event driver on a
simulated clock (no HTTP, no processes), the figures read the way `invoke bench` reads a real run.

Each request arrives at its time; the gateway's rule sends it to P/D when its effective tokens reach the
layout's threshold (every request when the layout has no colocated pool), else to the next colocated
instance (round robin, as the gateway's default). The records become `bench.client.Record`s, so TTFT,
TPOT, ITL, stalls, goodput and attainment are `bench.stats.summarize`'s, per length class as bench
splits them (the profile's `long_prompt_tokens` on the whole prompt), each route's request path
(`pdfleet.plan.path`: client, gateway, router) added to its first token. Queue times are vLLM's (scheduled −
arrived, per role), KV transfer times include waiting for the consumer's link.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pdfleet.bench.client import Record as ClientRecord
from pdfleet.bench.stats import Bounds, per_gpu, quantile, summarize
from pdfleet.model.catalog import DEFAULT_BLOCK_SIZE
from pdfleet.plan.path import NOT_MODELLED, RequestPath
from pdfleet.plan.space import Hardware, Layout, PoolShape
from pdfleet.sim.des import PDPool, Record, Simulation, run_alone
from pdfleet.sim.engine import Engine, EngineLimits
from pdfleet.sim.perf import PerfModel

CLASSES = ("short", "long")


@dataclass(frozen=True)
class Request:
    """One request of the traffic: arrival (s), prompt and output tokens, and the prompt tokens a
    colocated instance would still have to prefill (what the gateway's threshold is compared with)."""

    at: float
    prompt_tokens: int
    output_tokens: int
    effective_tokens: int


@dataclass
class Prediction:
    """One layout's figures: bench's summary keys overall and per class, per-GPU rates, queues, KV link."""

    layout: Layout
    summary: dict[str, Any]
    classes: dict[str, dict[str, Any]]
    per_gpu: dict[str, float]
    queues_ms: dict[str, float]  # prefill/decode queue P95 (colocated: the one queue under both names)
    kv: dict[str, float] = field(default_factory=dict)  # transfer P95/P99 ms, busiest link's busy share
    to_pd: int = 0  # requests the threshold sent to P/D

    def figure(self, key: str) -> float:
        """A summary figure (NaN when absent)."""
        v = self.summary.get(key)
        return float(v) if isinstance(v, int | float) else math.nan


def _engine(layout_pool: PoolShape, hw: Hardware) -> Engine:
    """One instance's engine: the roofline at its TP, its budget, the KV blocks its GPUs hold."""
    perf = PerfModel(hw.gpu, hw.model, layout_pool.tp, hw.kv_bytes_per_token)
    limits = EngineLimits(
        num_blocks=hw.kv_tokens(layout_pool.tp) // DEFAULT_BLOCK_SIZE,
        max_num_batched_tokens=layout_pool.budget,
    )
    return Engine(perf, limits)


def _p95(xs: list[float]) -> float:
    return 1000 * quantile(sorted(xs), 0.95)


def simulate(
    layout: Layout,
    requests: Sequence[Request],
    hw: Hardware,
    bounds: Bounds,
    long_tokens: int,
    path: RequestPath = NOT_MODELLED,
) -> Prediction:
    """Run the traffic through the layout on a simulated clock; the figures `invoke bench` would report,
    each route's request `path` added to its first tokens."""
    records, pd = run(layout, requests, hw)
    end = max((rec.token_times[-1] for _, _, rec in records if rec.token_times), default=0.0)
    return _figures(layout, records, pd, bounds, long_tokens, end, path)


def run(
    layout: Layout, requests: Sequence[Request], hw: Hardware
) -> tuple[list[tuple[Request, str, Record]], PDPool | None]:
    """Every request's record (with the pool that served it: colocated or disagg), and the P/D pool.

    The gateway's choices depend only on each request (its effective tokens, the round robin's turn), so
    each colocated instance's requests are known up front and it runs alone (`sim.des.run_alone`); the P/D
    pool, whose decode side waits on prefills and links, runs on the event queue.
    """
    to_pd: list[Request] = []
    to_colo: list[Request] = []
    has_pd = layout.prefill is not None and layout.decode is not None
    for req in requests:
        pd_bound = has_pd and (layout.colocated is None or req.effective_tokens >= (layout.threshold or 0))
        (to_pd if pd_bound else to_colo).append(req)
    records: list[tuple[Request, str, Record]] = []
    if layout.colocated is not None:
        n = layout.colocated.instances
        for i in range(n):
            mine = to_colo[i::n]  # the gateway's round robin over the requests it keeps colocated
            arrivals = [(r.at, r.prompt_tokens, r.output_tokens) for r in mine]
            done = run_alone(_engine(layout.colocated, hw), arrivals)
            records += [(r, "colocated", rec) for r, rec in zip(mine, done, strict=True)]
    sim = Simulation()
    pd = None
    if has_pd and to_pd:
        assert layout.prefill is not None and layout.decode is not None
        pd = PDPool(
            sim,
            [_engine(layout.prefill, hw) for _ in range(layout.prefill.instances)],
            [_engine(layout.decode, hw) for _ in range(layout.decode.instances)],
            hw.link,
            hw.kv_bytes_per_token,
        )

        def arrive(req: Request, pool: PDPool) -> None:
            records.append((req, "disagg", pool.submit(req.prompt_tokens, req.output_tokens)))

        for req in to_pd:
            sim.at(req.at, arrive, req, pd)
        sim.run()
    return records, pd


def client_record(req: Request, rec: Record, long_tokens: int, path_s: float = 0.0) -> ClientRecord:
    """The DES record as bench's client would have written it, its tokens `path_s` later (the request's
    path: every token is as late as the first, so TTFT and E2E grow and the gaps stay the engine's)."""
    chunks = [t + path_s for t in rec.token_times]
    return ClientRecord(
        length_class="long" if req.prompt_tokens >= long_tokens else "short",
        prompt_tokens=req.prompt_tokens,
        max_tokens=req.output_tokens,
        start=rec.arrival,
        end=chunks[-1] if chunks else math.nan,
        ttft=chunks[0] - rec.arrival if chunks else math.nan,
        chunks=chunks,
        output_tokens=len(chunks),
        error="" if chunks else "never finished",
    )


def _figures(
    layout: Layout,
    records: list[tuple[Request, str, Record]],
    pd: PDPool | None,
    bounds: Bounds,
    long_tokens: int,
    end: float,
    path: RequestPath,
) -> Prediction:
    """bench's figures of the run, the queues per role and the KV link's load."""
    turn = {}  # each record's place in its route's arrivals: which of the route's path samples it gets
    for route in ("colocated", "disagg"):
        mine = sorted(
            (k for k, (_, by, _) in enumerate(records) if by == route), key=lambda k: records[k][0].at
        )
        turn.update({k: n for n, k in enumerate(mine)})
    clients = [
        client_record(req, rec, long_tokens, path.seconds(by, turn[k]))
        for k, (req, by, rec) in enumerate(records)
    ]
    start = min((r.start for r in clients), default=0.0)
    duration = max(end - start, 1e-9)
    overall = summarize(clients, duration, bounds)
    classes = {c: summarize([r for r in clients if r.length_class == c], duration, bounds) for c in CLASSES}
    prefill_q: list[float] = []
    decode_q: list[float] = []
    for _, pool, rec in records:
        req = rec.request
        if pool == "colocated" and req.first_scheduled is not None:
            prefill_q.append(req.first_scheduled - req.arrival)
            decode_q.append(req.first_scheduled - req.arrival)
        elif pool == "disagg":
            pre = getattr(rec, "prefill", None)
            if pre is not None and pre.first_scheduled is not None:
                prefill_q.append(pre.first_scheduled - pre.arrival)
            if req.first_scheduled is not None and req.request_id != "pending":
                decode_q.append(req.first_scheduled - req.arrival)
    kv: dict[str, float] = {}
    if pd is not None and pd.transfers:
        secs = sorted(t for _, t, _ in pd.transfers)
        busy = [0.0] * len(pd.consumers)
        for i, _, nbytes in pd.transfers:
            busy[i] += pd.links[i].link.transfer_time(nbytes)
        kv = {
            "kv_transfer_p95_ms": 1000 * quantile(secs, 0.95),
            "kv_transfer_p99_ms": 1000 * quantile(secs, 0.99),
            "kv_link_busy_pct": 100 * max(busy) / duration,
        }
    return Prediction(
        layout,
        overall,
        classes,
        per_gpu(overall, layout.gpus),
        {"prefill_queue_p95_ms": _p95(prefill_q), "decode_queue_p95_ms": _p95(decode_q)},
        kv,
        sum(pool == "disagg" for _, pool, _ in records),
    )

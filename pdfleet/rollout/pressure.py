"""The automatic rebalance in the rollout controller (issue 35): the pools' figures read through the one
metrics client, the pure proposer (rollout.proposer) asked, and every proposal recorded in the controller's
audit log with the numbers behind it. The controller changes nothing itself: a move needs provisioning from
the control machine, which the controller does not do; `dry-run` only records, `on` records the proposal
(`mode: on`) for `invoke rebalance --follow` on the control machine to carry out (pdfleet.fleet.proposed).

Figures, each over `rollout.rebalance.window_s`, of the model's instances (Prometheus's `pool`/`role` target
labels): the prefill instances' queue time P95 (`vllm:request_queue_time_seconds`), the decode instances'
inter-token latency P95 (`vllm:inter_token_latency_seconds`), the busiest decode instance's KV usage
(`vllm:kv_cache_usage_perc`), the decode instances' preemptions per minute (`vllm:num_preemptions_total`),
the disaggregated pool's TTFT P95 at the gateway (recorded), the colocated instances' queue time P95
(deciding when the profile sets its band), and the instances up per pool (`up`). A series
that is absent is no data (None); the cool-down survives a restart (the last proposal is read back from the
audit log).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from pdfleet.metrics.source import MetricsError, MetricsSource, SeriesAbsent
from pdfleet.model.rebalancing import RebalanceSpec
from pdfleet.rollout.proposer import Figures, ProposerState, propose
from pdfleet.rollout.store import Store

log = logging.getLogger("pdfleet.rollout")

EVERY_S = 5.0  # the figures are read at most this often (a tick is every rollout.interval_s)
EVENT = "rebalance-proposal"
POOL_LABELS = {
    "prefill": {"pool": "disagg", "role": "prefill"},
    "decode": {"pool": "disagg", "role": "decode"},
    "colocated": {"pool": "colocated", "role": "colocated"},
}


def read_figures(source: MetricsSource, window_s: float, model: str | None = None) -> Figures:
    """The figures the proposer decides on (MetricsError when the source fails)."""
    mine = {"model": model} if model is not None else {}

    def quantile(name: str, match: Mapping[str, str]) -> float | None:
        try:
            got = source.quantile(0.95, name, window_s, match={**match, **mine}).get(())
        except SeriesAbsent:
            return None
        return None if got is None else got * 1000.0

    def per_host(name: str, match: Mapping[str, str]) -> dict[tuple[str, ...], float]:
        try:
            return dict(source.value(name, by=("host",), match={**match, **mine}))
        except SeriesAbsent:
            return {}

    decode = POOL_LABELS["decode"]
    try:
        preempted = sum(
            source.increase("vllm:num_preemptions_total", window_s, match={**decode, **mine}).values()
        )
        per_min: float | None = preempted * 60.0 / window_s
    except SeriesAbsent:
        per_min = None
    kv = per_host("vllm:kv_cache_usage_perc", decode)
    hosts = {
        pool: sum(1 for up in per_host("up", match).values() if up > 0) for pool, match in POOL_LABELS.items()
    }
    return Figures(
        prefill_queue_p95_ms=quantile("vllm:request_queue_time_seconds", POOL_LABELS["prefill"]),
        decode_itl_p95_ms=quantile("vllm:inter_token_latency_seconds", decode),
        decode_kv_usage=max(kv.values()) if kv else None,
        decode_preemptions_per_min=per_min,
        ttft_p95_ms=quantile("pdfleet_gateway_ttft_seconds", {"pool": "disagg"}),
        colocated_queue_p95_ms=quantile("vllm:request_queue_time_seconds", POOL_LABELS["colocated"]),
        hosts=hosts,
    )


@dataclass
class AutoRebalancer:
    """One model's automatic rebalance: called on every controller tick, it reads the figures (at most every
    EVERY_S), asks the proposer and records a proposal."""

    spec: RebalanceSpec
    source: MetricsSource
    store: Store
    clock: Callable[[], float]
    model: str | None = None
    state: ProposerState = field(default_factory=ProposerState)
    _read_at: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        last = [e for e in self.store.history(last=500) if e.get("event") == EVENT]
        if last:
            self.state = ProposerState(last_at=float(last[-1]["at"]), last_to=str(last[-1]["to"]))

    def tick(self) -> dict[str, object] | None:
        """Read, decide, record: the proposal's event (None: no proposal this tick). Never raises: what
        fails is logged, and the next tick tries again."""
        try:
            return self._tick()
        except Exception:  # the rollout's loop goes on whatever the automatic rebalance does
            log.exception("rebalance: the tick failed")
            return None

    def _tick(self) -> dict[str, object] | None:
        now = self.clock()
        if self._read_at is not None and now - self._read_at < EVERY_S:
            return None
        self._read_at = now
        try:
            figures = read_figures(self.source, self.spec.window_s, self.model)
        except MetricsError as exc:  # the rollout's own ticks report a blind source; this waits for it
            log.warning("rebalance: the figures cannot be read: %s", exc)
            return None
        self.state, proposal, why = propose(self.state, figures, self.spec, now)
        if proposal is None:
            log.debug("rebalance: %s", why)
            return None
        event: dict[str, object] = {
            "at": now,
            "event": EVENT,
            "mode": self.spec.mode,
            "from": proposal.source,
            "to": proposal.target,
            "why": proposal.why,
            "figures": proposal.figures,
        }
        self.store.record([event])
        log.info(
            "rebalance (%s): move one host %s -> %s: %s",
            self.spec.mode,
            proposal.source,
            proposal.target,
            why,
        )
        return event

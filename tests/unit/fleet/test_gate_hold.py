"""The gate hold after a --to-plan move, on the rollout's own gate machinery over a real metrics source (a
direct scrape of a gateway's exposition served on loopback; time moves only when the hold sleeps, and each
sleep is a second of traffic): passing gates pass after the hold's duration, a disaggregated TTFT past its
ratio to the colocated one fails it, too little traffic fails it at the deadline, and with nothing routed to
the disaggregated pool there is no gate to hold."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from prometheus_client import Counter, Histogram

from pdfleet.fleet.gate_hold import GateConfig, hold, routed_share
from pdfleet.metrics.direct import DirectScrape, Target
from pdfleet.model.rollout import RolloutSpec
from pdfleet.model.stages import StageSpec
from tests.unit.metrics.helpers import exporter

SPEC = RolloutSpec.model_validate(
    {
        "interval_s": 1.0,
        "window_s": 4,
        "min_samples": 5,
        "gates": [{"name": "ttft-vs-colocated", "metric": "ttft", "quantile": 0.99, "max_ratio": 2.0}],
    }
)
CONFIG = GateConfig(SPEC, {"ttft_p99_ms": 5000.0}, kv=None)


@dataclass
class Traffic:
    """A gateway's series and a clock; each `sleep` is that many seconds of requests at these figures."""

    decisions: Counter
    ttft: Histogram
    source: DirectScrape
    disagg_ttft_s: float = 0.2
    disagg_per_s: int = 3
    now: float = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        for _ in range(round(seconds)):
            for _ in range(self.disagg_per_s):
                self.decisions.labels("long", "disagg").inc()
                self.ttft.labels("disagg", "long").observe(self.disagg_ttft_s)
            self.decisions.labels("long", "colocated").inc()
            self.ttft.labels("colocated", "long").observe(0.2)
            self.decisions.labels("short", "colocated").inc()


@pytest.fixture
def traffic() -> Iterator[Traffic]:
    with exporter() as gw:
        decisions = Counter(
            "pdfleet_gateway_routing_decisions", "d", ["length_class", "pool"], registry=gw.registry
        )
        ttft = Histogram(
            "pdfleet_gateway_ttft_seconds",
            "t",
            ["pool", "length_class"],
            buckets=(0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            registry=gw.registry,
        )
        t = Traffic(decisions, ttft, None)  # type: ignore[arg-type]
        t.source = DirectScrape([Target(gw.url, {"job": "gateway"})], clock=t.clock)
        t.source.scrape()  # the window's start (Prometheus keeps its own history)
        yield t


def test_passing_gates_pass_after_the_hold(traffic: Traffic) -> None:
    out = hold(traffic.source, CONFIG, 6.0, lambda _: None, traffic.clock, traffic.sleep)
    assert out.ok and out.reason.startswith("every gate passed over 6 s (ttft-vs-colocated (long): ")
    assert routed_share(traffic.source, 4) == StageSpec(short=0, long=75)


def test_a_gate_past_its_ratio_fails_the_hold(traffic: Traffic) -> None:
    traffic.disagg_ttft_s = 2.0
    lines: list[str] = []
    out = hold(traffic.source, CONFIG, 6.0, lines.append, traffic.clock, traffic.sleep)
    assert not out.ok
    assert out.reason.startswith("failed: gate failed: ttft-vs-colocated (long): ")
    assert "> 2 x colocated" in out.reason
    assert out.ticks < 6  # it does not wait out the hold


def test_the_move_s_own_traffic_before_the_hold_is_not_decided_on(traffic: Traffic) -> None:
    traffic.disagg_ttft_s = 2.0  # the move's router restart: slow (or fallen back) P/D requests
    traffic.sleep(4)
    traffic.source.scrape()  # Prometheus scrapes on its own schedule: one as the move ends
    traffic.disagg_ttft_s = 0.2
    out = hold(traffic.source, CONFIG, 4.0, lambda _: None, traffic.clock, traffic.sleep)
    assert out.ok, out.reason
    assert out.ticks == 4  # nothing decided before the window (4 s) held only traffic after the move


def test_too_little_traffic_fails_the_hold_at_its_deadline(traffic: Traffic) -> None:
    traffic.disagg_per_s = 1  # one a second: 3 in the direct scrape's window (4 s less its slack), 5 needed
    out = hold(traffic.source, CONFIG, 4.0, lambda _: None, traffic.clock, traffic.sleep)
    assert (out.ok, out.ticks) == (False, 16)
    assert out.reason == "inconclusive: too little traffic: 3 of 5 samples in the window after 16 s"


def test_nothing_routed_to_the_disaggregated_pool_leaves_no_gate_to_hold(traffic: Traffic) -> None:
    traffic.disagg_per_s = 0
    out = hold(traffic.source, CONFIG, 5.0, lambda _: None, traffic.clock, traffic.sleep)
    assert out.ok and out.ticks == 5
    assert out.reason == "no length class went to the disaggregated pool in the last 4 s: no gate to hold"

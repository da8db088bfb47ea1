"""The profile's `monitoring:` section (Prometheus on the monitoring group) and the metric facts per release.

Retention, scrape and rule-evaluation intervals, the port Prometheus listens on (the host's address),
how long a condition must hold before an alert fires, and the alert thresholds the guide gives that
the `slo:` section does not (KV transfer P95, prefill queue, preemptions, fallbacks, stalls).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pdfleet.model.alerting import AlertmanagerSpec
from pdfleet.model.connectors import MOONCAKE, NIXL
from pdfleet.model.vllm_release_data import RELEASES
from pdfleet.model.vllm_releases import find_release

Port = Annotated[int, Field(ge=1, le=65535)]
# a node exporter collector's name, as its --collector.NAME / --no-collector.NAME flags spell it
CollectorName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,40}$")]


class MonitoringSpec(BaseModel):
    """Prometheus on the monitoring group: storage, intervals, and the guide's alert thresholds."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    port: Port = 9090
    scrape_interval_s: int = Field(default=15, ge=1, le=300)
    evaluation_interval_s: int = Field(default=15, ge=1, le=300)
    retention_days: int = Field(default=15, ge=1, le=3650)
    retention_size_gb: int | None = Field(default=None, ge=1, le=100_000)
    # how long a condition must hold before its alert fires (Prometheus's `for:`)
    alert_for_s: int = Field(default=300, ge=0, le=86_400)
    # the window the recording rules' quantiles and rates look back over
    rule_window_s: int = Field(default=300, ge=10, le=86_400)
    # the guide: KV transfer P95 above 200 ms means the transport is the bottleneck
    kv_transfer_p95_ms: float = Field(default=200, gt=0)
    # prefill queue time P95 that, with prefill KV cache under-used, says the token budget is too small
    prefill_queue_p95_ms: float = Field(default=500, gt=0)
    prefill_kv_usage_below: float = Field(default=0.5, gt=0, le=1)
    decode_preemptions_per_min: float = Field(default=1.0, gt=0)
    fallback_ratio: float = Field(default=0.05, gt=0, le=1)  # fallbacks / requests through the gateway
    stalls_per_min: float = Field(default=1.0, gt=0)
    # Debian's prometheus-node-exporter on every host of the inventory (the host's address)
    node_exporter_port: Port = 9100
    # collectors turned off (--no-collector.NAME) beside Debian's defaults, which include systemd's: a D-Bus
    # walk of every unit on each scrape (no pdfleet series, rule or panel reads node_systemd_*)
    node_exporter_collectors_off: list[CollectorName] = Field(default_factory=list)
    alertmanager: AlertmanagerSpec = Field(default_factory=AlertmanagerSpec)

    @model_validator(mode="after")
    def _window_covers_scrapes(self) -> MonitoringSpec:
        """rate() needs at least two samples in its window; four scrapes make it robust to one missed."""
        if self.rule_window_s < 4 * self.scrape_interval_s:
            raise ValueError(
                f"rule_window_s ({self.rule_window_s}) must be at least 4 × scrape_interval_s "
                f"({4 * self.scrape_interval_s}): rates need several scrapes in their window"
            )
        return self


@dataclass(frozen=True)
class KVTransferSeries:
    """What a P/D fleet exports about KV transfer: the connector's transfer-time histogram, its failure
    counters, and the role whose instances observe the histogram (NIXL: D pulls; Mooncake: P pushes, its
    stats.py says the histograms are populated on P only)."""

    connector: str
    histogram: str
    failed: tuple[str, ...]  # counters (registered names, without _total) of failed transfers
    role: str


# per connector: (histogram, failure counters, the role observing the histogram), as vLLM names them
_KV_SERIES = {
    NIXL: ("vllm:nixl_xfer_time_seconds", ("vllm:nixl_num_failed_transfers",), "decode"),
    MOONCAKE: (
        "vllm:mooncake_xfer_time_seconds",
        ("vllm:mooncake_num_failed_transfers", "vllm:mooncake_num_failed_recvs"),
        "prefill",
    ),
}


def kv_transfer_series(connector: str, version: str) -> KVTransferSeries | None:
    """The KV-transfer series of a connector on a pinned release, where the release registers them (the
    facts table; vLLM and the simulator modelling it alike); None otherwise (0.11.0, an untabled pin)."""
    rel = find_release(version, RELEASES)
    if rel is None or connector not in _KV_SERIES:
        return None
    histogram, failed, role = _KV_SERIES[connector]
    names = rel.metric_names()
    if histogram not in names:
        return None
    return KVTransferSeries(connector, histogram, tuple(f for f in failed if f in names), role)

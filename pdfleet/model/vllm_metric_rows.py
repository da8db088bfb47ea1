"""The metric rows of the vLLM release facts (`vllm_releases.Release.metrics`, `other_metrics`,
`transfer_logs`): the Prometheus families a release registers, the others it declares, and the keys of
its connectors' `KV Transfer metrics` log line. Written by `tools/vllm_facts.py` from each wheel.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """One Prometheus metric: name, type, labels and histogram buckets as vLLM registers it."""

    name: str
    kind: str  # gauge, counter, histogram
    labels: tuple[str, ...]
    buckets: tuple[float, ...] | None
    buckets_rule: str | None  # when the bounds depend on the model (e.g. 1-2-5 up to max_model_len)
    when: str | None  # the condition it is registered under (None: always)
    source: str
    # what a KV-connector counter adds up, as its `observe` zips it with the connector's stats keys (0.33's
    # nixl_num_failed_transfers: transfers, handshakes and notifications); empty: not a connector counter
    counts: tuple[str, ...] = ()
    # label values vLLM sets on every start, per label (request_success: one series per FinishReason, its
    # FINISH_REASON_STRINGS); empty: values come with traffic or from the configuration
    label_values: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class TransferLog:
    """The periodic `KV Transfer metrics: k=v, ...` line of a connector: `KVConnectorLogging.log` joins the
    items of its stats' `reduce()`; these are that dict's keys, in order, for an interval with transfers
    (0.11.0's NIXL counts transfers only; 0.33 adds failure counts)."""

    connector: str
    keys: tuple[str, ...]
    source: str


@dataclass(frozen=True)
class OtherMetrics:
    """`vllm:` metric families one file declares that the `metrics` rows do not hold: registered by a part
    of vLLM pdfleet does not render or model (KV offloading and other connectors' stats, speculative
    decoding, the RL, sleep-mode and realtime endpoints, perf estimates), some through generic helpers
    (metadata dicts, name constants). Tabled by name only, so that every family a release declares is in
    the table (a `metrics` row or here) and the next release's new ones show in the generator's diff."""

    names: tuple[str, ...]  # sorted
    source: str

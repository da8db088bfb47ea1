"""The chain table's pure parts: which Prometheus to read, how numbers and missing data are shown."""

from __future__ import annotations

import dataclasses

import pytest

from pdfleet.errors import ValidationError
from pdfleet.metrics.bounds import BUCKETS
from pdfleet.monitoring.chain_table import (
    NO_DATA,
    ChainTable,
    FigureRows,
    StepRows,
    fmt_seconds,
    format_table,
    model_labels,
    of_model,
    prometheus_url,
)
from pdfleet.monitoring.recording import CHAIN, figures
from tests.unit.fleet.helpers import REPO, fleet_of


def test_the_topology_prometheus_or_the_option() -> None:
    fleet = fleet_of("lab-cross", REPO / "inventory" / "lab.yml")
    port = fleet.profile.monitoring.port
    assert prometheus_url(fleet.topology, None) == f"http://198.18.0.10:{port}"
    assert prometheus_url(fleet.topology, "http://127.0.0.1:9999/") == "http://127.0.0.1:9999"
    with pytest.raises(ValidationError, match="not an http"):
        prometheus_url(fleet.topology, "127.0.0.1:9090")
    without = dataclasses.replace(fleet.topology, monitoring=())
    with pytest.raises(ValidationError, match="no host in group `monitoring`"):
        prometheus_url(without, None)


def test_durations_and_missing_data() -> None:
    assert [fmt_seconds(v) for v in (0.0042, 0.25, 1.5, None)] == ["4.2 ms", "250 ms", "1.50 s", NO_DATA]


def test_a_quantile_inside_the_first_bucket_is_only_under_its_bound() -> None:
    """vLLM's request times start at 0.3 s: monitor printed the interpolated 150/285/297 ms as figures."""
    queue = BUCKETS["vllm:request_queue_time_seconds"]
    assert [fmt_seconds(v, queue) for v in (0.15, 0.285, 0.297)] == ["<300 ms"] * 3
    assert [fmt_seconds(v, queue) for v in (0.3, 0.41, None)] == ["300 ms", "410 ms", NO_DATA]
    first = {("disagg", "prefill"): {0.5: 0.15, 0.95: 0.285, 0.99: 0.297}}
    steps = (StepRows(CHAIN[4], first, first),)
    text = format_table(ChainTable(steps, (), 600, 30), "T")
    row = next(line for line in text.splitlines() if line.startswith(CHAIN[4].title))
    assert row.count("<300 ms") == 6 and "285" not in row


def test_rows_per_group_and_no_data_rows() -> None:
    ttft, queue = CHAIN[0], CHAIN[4]
    steps = (
        StepRows(
            ttft,
            {("disagg", "long"): {0.5: 0.1, 0.95: 0.2, 0.99: None}},
            {("disagg", "long"): {0.5: 0.1, 0.95: 0.3, 0.99: 0.4}},
        ),
        StepRows(queue, {}, {}),
    )
    fig = figures("30s")[0]
    text = format_table(ChainTable(steps, (FigureRows(fig, {("disagg", "long"): 2.5}),), 600, 30), "T")
    lines = text.splitlines()
    assert lines[0] == "T" and "10 min" in lines[1]
    row = next(line for line in lines if line.startswith(ttft.title))
    assert row.split()[4:] == [
        "disagg",
        "long",
        "100",
        "ms",
        "200",
        "ms",
        "no",
        "data",
        "100",
        "ms",
        "300",
        "ms",
        "400",
        "ms",
    ]
    assert next(line for line in lines if line.startswith(queue.title)).count(NO_DATA) == 6
    figure_row = next(line for line in lines if line.startswith(fig.title))
    assert figure_row.split()[-3:] == ["disagg", "long", "2.5"]


def test_each_model_gets_its_own_rows_and_the_fleet_figures() -> None:
    """lab-two-models: both run a colocated pool; a section shows its model's rows only, the label gone.
    The P/D model's gateway series carry its group name, a single-model profile's its alias."""
    fleet = fleet_of("lab-two-models", REPO / "inventory" / "lab.yml")
    big, small = (model_labels(spec) for spec in fleet.profile.served)
    assert big == {"llama-8b", "llama-3.1-8b"} and small == {"llama-1b", "llama-3.2-1b"}
    ttft = CHAIN[0]
    both: dict[tuple[str, ...], dict[float, float | None]] = {
        ("llama-8b", "colocated", "long"): {0.5: 0.5},
        ("llama-1b", "colocated", "long"): {0.5: 0.1},
    }
    rates = {f.name: f for f in figures("30s")}
    table = ChainTable(
        (StepRows(ttft, both, both),),
        (
            FigureRows(
                rates["pool_class:gateway_requests:rate"], {("llama-3.2-1b", "colocated", "long"): 3.0}
            ),
            FigureRows(rates["fleet:gateway_fallback:ratio"], {(): 0.25}),
        ),
        600,
        30,
    )
    mine = of_model(table, small)
    assert mine.steps[0].now == {("colocated", "long"): {0.5: 0.1}}
    assert mine.figures[0].values == {("colocated", "long"): 3.0}
    assert mine.figures[1].values == {(): 0.25}  # fleet-wide: shown in every section
    theirs = of_model(table, big)
    assert theirs.steps[0].window == {("colocated", "long"): {0.5: 0.5}} and theirs.figures[0].values == {}

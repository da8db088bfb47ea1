"""`invoke monitor` against a real Prometheus running the rendered recording rules: the chain table
shows the numbers, `no data` where there are none, and a clear error when Prometheus is down."""

from __future__ import annotations

import math
import threading
from pathlib import Path

import pytest
from invoke.exceptions import Exit
from prometheus_client import Gauge, Histogram

from pdfleet.bench.procs import free_port
from pdfleet.cli.monitor import monitor
from pdfleet.monitoring.monitoring_config import dump
from pdfleet.monitoring.recording import recording_rules
from pdfleet.sim.metrics import TTFT_BUCKETS
from tests.unit.cli.helpers import REPO, project_context
from tests.unit.fleet.helpers import fleet_of, monitoring_on_port
from tests.unit.metrics.helpers import exporter, prometheus, scrape_config, wait_for

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py


def test_the_table_shows_the_chain_from_the_recorded_series(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = fleet_of("lab-cross", REPO / "inventory" / "lab.yml")
    rules = tmp_path / "recording.yml"
    rules.write_text(dump(recording_rules(fleet.profile, True)))
    stop = threading.Event()
    with exporter() as exp:
        ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "TTFT",
            ["model_name", "engine"],
            buckets=TTFT_BUCKETS,
            registry=exp.registry,
        ).labels("m", "0")
        Gauge("vllm:num_requests_waiting", "waiting", ["model_name", "engine"], registry=exp.registry).labels(
            "m", "0"
        ).set(3)

        def traffic() -> None:
            while not stop.wait(0.1):
                ttft.observe(0.3)

        # as the topology labels lab-cross's decode target: its model's name (the rows are shown per model)
        model = fleet.topology.pool("decode")[0].model
        labels = {"pool": "disagg", "role": "decode", "host": "lab-d1", "model": model}
        config = scrape_config([(f"127.0.0.1:{exp.port}", labels)], rule_files=[str(rules)])
        thread = threading.Thread(target=traffic, daemon=True)
        thread.start()
        try:
            with prometheus(tmp_path / "prom", config) as prom:

                def recorded() -> bool:
                    # the quantiles and the rates are two rule groups, each evaluated at its own offset
                    ttft = prom.client.instant("pool_role:vllm_ttft_seconds:p50")
                    waiting = prom.client.instant("pool_role:vllm_num_requests_waiting:sum")
                    return bool(ttft) and not math.isnan(ttft[0].value) and bool(waiting)

                wait_for(recorded, 60, "the TTFT and waiting recording rules")
                monitor(project_context(), profile="lab-cross", prometheus=prom.url, minutes="1")
        finally:
            stop.set()
            thread.join(5)
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("TTFT in vLLM"))
    cells = row.split()
    assert cells[3:5] == ["disagg", "decode"], row
    assert "ms" in row and "no data" not in row  # 0.3 s observations: P50..P99 in the 250-500 ms bucket
    kv = next(line for line in out.splitlines() if line.startswith("KV transfer (NIXL)"))
    assert "no data" in kv  # this exporter has no vllm:nixl_* series: said, not shown as zero
    waiting = next(line for line in out.splitlines() if line.startswith("waiting"))
    assert waiting.split()[-1] == "3" and "disagg decode" in waiting


def test_prometheus_down_is_one_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(Exit) as exit_info:
        monitor(project_context(), profile="lab-cross", prometheus=f"http://127.0.0.1:{free_port()}")
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "is not answering" in err and "Traceback" not in err


def test_an_unknown_model_is_refused_naming_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(Exit):
        monitor(
            project_context(),
            profile="lab-two-models",
            model="gpt-4o",
            prometheus=f"http://127.0.0.1:{free_port()}",
        )
    err = capsys.readouterr().err
    assert "no model 'gpt-4o' (--model): llama-8b, llama-1b" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"minutes": "abc"}, "--minutes: 'abc' is not a number"),
        ({"minutes": "0.5"}, "--minutes: 0.5 is less than one minute"),
        ({"interval": "0"}, "--interval: 0 s is less than 1 s"),
        ({"minutes": "1e308"}, "--minutes: 1e308 is more than 527040"),  # N11: a traceback
        ({"interval": "1e308"}, "--interval: 1e308 is more than 86400"),
        ({"prometheus": "ftp://x"}, "--prometheus: 'ftp://x' is not an http(s) URL"),
    ],
)
def test_bad_options_are_errors(
    options: dict[str, str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    options = {"prometheus": f"http://127.0.0.1:{free_port()}", **options}
    with pytest.raises(Exit):
        monitor(project_context(), profile="lab-cross", **options)
    assert message in capsys.readouterr().err


def test_without_an_option_it_reads_the_profiles_monitoring_port(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """monitoring.port other than 9090: the monitoring host's Prometheus on that port is the one read."""
    with prometheus(tmp_path / "prom", scrape_config([])) as prom:
        assert prom.port != 9090
        profiles, profile, inventory = monitoring_on_port(tmp_path, prom.port)
        ctx = project_context(profiles_dir=str(profiles))
        monitor(ctx, profile=str(profile), inventory=str(inventory), minutes="1")
    head = capsys.readouterr().out.splitlines()[0]
    assert f"— http://127.0.0.1:{prom.port} —" in head, head

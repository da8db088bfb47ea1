"""`invoke doctor --profile`'s metrics source: the topology's Prometheus (the profile's monitoring.port)
when it answers, else direct scrapes of the vLLM endpoints."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pdfleet.cli.doctor_fleet import fleet_metrics
from pdfleet.fleet.topology import Instance
from pdfleet.metrics.direct import DirectScrape
from pdfleet.metrics.prometheus import PrometheusClient
from tests.unit.fleet.helpers import deploy, monitoring_on_port
from tests.unit.metrics.helpers import exporter, prometheus, scrape_config

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py


def test_prometheus_is_read_on_the_profiles_monitoring_port(tmp_path: Path) -> None:
    with prometheus(tmp_path / "prom", scrape_config([])) as prom:
        assert prom.port != 9090
        profiles, profile, inventory = monitoring_on_port(tmp_path, prom.port)
        d = deploy(str(profile), inventory, profiles, roles=(), secrets=None)
        # no lab address is contacted, whatever happens: the lab's vLLM instances are left out
        source, what, window = fleet_metrics(dataclasses.replace(d.topology, instances=()), 600, 0.1, 5)
    assert isinstance(source, PrometheusClient) and source.base_url == f"http://127.0.0.1:{prom.port}"
    assert (what, window) == (f"Prometheus at http://127.0.0.1:{prom.port}", 600)


def test_without_a_monitoring_host_the_vllm_endpoints_are_scraped_directly(tmp_path: Path) -> None:
    profiles, profile, inventory = monitoring_on_port(tmp_path, 9191)
    d = deploy(str(profile), inventory, profiles, roles=(), secrets=None)
    with exporter() as exp:
        # one colocated instance on loopback in place of the lab's (which are not contacted here)
        local = Instance("colocated", "c1", "127.0.0.1", exp.port, (0,), None, None, None, None)
        bare = dataclasses.replace(d.topology, monitoring=(), instances=(local,), gateways=())
        source, what, window = fleet_metrics(bare, 600, 0.1, 5)
    assert isinstance(source, DirectScrape) and [t.url for t in source.targets] == [exp.url]
    assert (what, window) == ("direct scrape of 1 vLLM endpoints over 0.1 s", 0.1)


def test_verify_results_become_kv_path_outcomes_split_into_summary_and_fix() -> None:
    from pdfleet.checks.kv_path import Verdict, failure_message
    from pdfleet.checks.verify import CheckResult
    from pdfleet.cli.doctor_fleet import kv_path_outcomes

    bad = Verdict(False, "p->d: the probe's side channel 10.0.0.1:5599 is unreachable", "allow TCP 5599")
    results = [
        CheckResult("p->d", "kv_path/kv_path", "fail", failure_message(bad)),
        CheckResult("p->d2", "kv_path/kv_path", "pass", "p->d2: 64 MiB in 227 ms = 2.36 Gb/s"),
        CheckResult("p", "kv/kv_library_importable", "pass"),  # not the probe: left out
        CheckResult("-", "collect kv_path.py", "fail", "ImportError: nixl"),
    ]
    found = kv_path_outcomes(results)
    assert [(r.pair, r.outcome) for r in found] == [
        ("p->d", "fail"),
        ("p->d2", "pass"),
        ("collect kv_path.py", "fail"),
    ]
    assert (found[0].summary, found[0].fix) == (bad.summary, bad.fix)
    assert found[1].summary.endswith("2.36 Gb/s") and found[2].fix == ""

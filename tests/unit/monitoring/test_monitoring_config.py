"""Prometheus's config from the topology: jobs, labels, vLLM's names restored, flags from the profile."""

from __future__ import annotations

import pytest
import yaml

from pdfleet.errors import ValidationError
from pdfleet.fleet.topology import MetricsEndpoint, Prometheus
from pdfleet.monitoring.monitoring_config import (
    VLLM_NAME_RELABEL,
    defaults_file,
    prometheus_args,
    prometheus_config,
    scrape_jobs,
)
from tests.unit.fleet.helpers import REPO, fleet_of


def test_jobs_in_order_with_topology_labels_and_instance_by_host() -> None:
    endpoints = [
        MetricsEndpoint("pdfleet-gateway", "gw", "10.0.0.1", 8080, {"role": "gateway", "host": "gw"}),
        MetricsEndpoint("vllm", "p1", "10.0.0.2", 8100, {"pool": "disagg", "role": "prefill", "host": "p1"}),
    ]
    jobs = scrape_jobs(endpoints)
    assert [j["job_name"] for j in jobs] == ["vllm", "pdfleet-gateway"]
    assert jobs[0]["static_configs"] == [
        {
            "targets": ["10.0.0.2:8100"],
            "labels": {"pool": "disagg", "role": "prefill", "host": "p1", "instance": "p1:8100"},
        }
    ]
    assert jobs[0]["metric_relabel_configs"] == [VLLM_NAME_RELABEL]
    assert "metric_relabel_configs" not in jobs[1]  # the gateway's names have no colon to restore


def test_config_has_profile_intervals_rule_files_and_prometheus_itself() -> None:
    fleet = fleet_of("lab-cross", REPO / "inventory" / "lab.yml")
    server = fleet.topology.prometheus
    assert server is not None and server.host == "lab-gw"
    doc = yaml.safe_load(prometheus_config(fleet.profile, fleet.topology, server))
    mon = fleet.profile.monitoring
    assert doc["global"]["scrape_interval"] == f"{mon.scrape_interval_s}s"
    assert doc["global"]["evaluation_interval"] == f"{mon.evaluation_interval_s}s"
    assert doc["rule_files"] == [
        "/etc/prometheus/pdfleet/recording.yml",
        "/etc/prometheus/pdfleet/alerts.yml",
    ]
    own = doc["scrape_configs"][0]
    assert own["job_name"] == "prometheus" and own["static_configs"][0]["targets"] == [
        f"{fleet.inventory.hosts['lab-gw'].address}:{mon.port}"
    ]


def test_retention_size_is_a_flag_only_when_set() -> None:
    fleet = fleet_of("colocated")
    server = Prometheus("m", "10.0.0.5", fleet.profile.monitoring.port)
    assert not any("retention.size" in a for a in prometheus_args(fleet.profile, server))
    sized = fleet.profile.model_copy(
        update={"monitoring": fleet.profile.monitoring.model_copy(update={"retention_size_gb": 50})}
    )
    assert "--storage.tsdb.retention.size=50GB" in prometheus_args(sized, server)


def test_an_address_with_quotes_cannot_reach_the_defaults_file() -> None:
    """The inventory validates addresses; this is the last guard before a shell-read file."""
    fleet = fleet_of("colocated")
    bad = Prometheus("m", '10.0.0.1" EVIL="1', 9090)
    with pytest.raises(ValidationError, match="host m: address .* cannot be written"):
        defaults_file(fleet.profile, bad)

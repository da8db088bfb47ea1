"""node_exporter: every host runs Debian's exporter on its own address and the profile's port, the
topology's `node` endpoint, and GPU hosts say why there is no DCGM exporter."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from pdfleet.model.monitoring import MonitoringSpec
from pdfleet.ops.apt import AptPackage, AptPackages
from pdfleet.ops.base import FakeFacts, Skip
from pdfleet.ops.files import File
from roles import node_exporter
from tests.unit.roles.helpers import deployment


def test_every_host_listens_on_its_address_and_is_a_scrape_target() -> None:
    fleet = deployment("lab-cross")
    port = fleet.profile.monitoring.node_exporter_port
    for host in fleet.inventory.hosts.values():
        ctx = fleet.context(host)
        assert node_exporter.applies(ctx)
        (defaults,) = node_exporter.files(ctx)
        assert f'ARGS="--no-collector.systemd --web.listen-address={host.address}:{port}"' in defaults.content
        (unit,) = node_exporter.units(ctx)
        assert unit.health_url == f"http://{host.address}:{port}/metrics"
    assert {e.host for e in fleet.topology.metrics_endpoints if e.job == "node"} == set(fleet.inventory.hosts)


def test_the_flags_come_before_the_package_and_gpu_hosts_say_why_no_dcgm() -> None:
    fleet = deployment("lab-cross")
    decode = fleet.context(fleet.inventory.hosts["lab-d1"])
    ops = list(node_exporter.operations(decode, FakeFacts({AptPackages(): {}})))
    kinds = [type(op) for op in ops]
    assert kinds.index(File) < kinds.index(AptPackage)
    (skip,) = [op for op in ops if isinstance(op, Skip)]
    assert "DCGM" in skip.reason and "no mirror" in skip.reason
    gateway = fleet.context(fleet.inventory.hosts["lab-gw"])  # no GPU: nothing to say
    assert not [
        op for op in node_exporter.operations(gateway, FakeFacts({AptPackages(): {}})) if isinstance(op, Skip)
    ]


def test_labels_say_what_each_host_runs() -> None:
    fleet = deployment("lab-cross")
    labels = {e.host: dict(e.labels) for e in fleet.topology.node_exporters}
    assert labels["lab-gw"] == {"host": "lab-gw", "role": "gateway,prometheus"}
    assert labels["lab-d1"] == {"host": "lab-d1", "role": "decode", "pool": "disagg"}
    assert labels["lab-colo1"] == {"host": "lab-colo1", "role": "colocated", "pool": "colocated"}


def test_collectors_off_are_flags_and_a_bad_name_is_refused() -> None:
    """Debian's defaults unless the profile turns collectors off (the lab profiles turn systemd's off)."""
    assert deployment("lab-cross").profile.monitoring.node_exporter_collectors_off == ["systemd"]
    fleet = deployment("cross-rdma", "inventory/examples/cross-rdma.yml")
    assert fleet.profile.monitoring.node_exporter_collectors_off == []
    host = next(iter(fleet.inventory.hosts.values()))
    port = fleet.profile.monitoring.node_exporter_port
    assert node_exporter.exporter_args(fleet.context(host)) == [f"--web.listen-address={host.address}:{port}"]
    off = MonitoringSpec(node_exporter_collectors_off=["systemd", "udp_queues"])
    assert off.node_exporter_collectors_off == ["systemd", "udp_queues"]
    with pytest.raises(ValidationError, match="node_exporter_collectors_off"):
        MonitoringSpec(node_exporter_collectors_off=["systemd --web.listen-address=0.0.0.0:1"])

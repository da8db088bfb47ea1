"""node_exporter: every host runs Debian's exporter on its own address and the profile's port, the
topology's `node` endpoint, and GPU hosts say why there is no DCGM exporter."""

from __future__ import annotations

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
        assert f'ARGS="--web.listen-address={host.address}:{port}"' in defaults.content
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

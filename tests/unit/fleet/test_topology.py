"""The topology, for every profile × inventory of the repo that fit together: where each instance, gateway,
router and metrics endpoint is, which hosts are lab hosts and which run pdfleet code."""

from __future__ import annotations

import dataclasses
import ipaddress
from pathlib import Path

import pytest

from pdfleet.fleet.topology import ROUTER_ADDRESS, Topology, build_topology
from pdfleet.model.inventory import Inventory, load_inventory
from pdfleet.model.profile import Profile
from pdfleet.model.profile_loader import load_profile
from tests.unit.fleet.helpers import REPO, profile_inventory_pairs

LAB_NETWORK = ipaddress.IPv4Network("198.18.0.0/24")
PAIRS = profile_inventory_pairs()


def _load(profile: str, inventory: Path) -> tuple[Profile, Inventory, Topology]:
    prof = load_profile(profile, REPO / "profiles")
    inv = load_inventory(inventory)
    return prof, inv, build_topology(prof, inv, LAB_NETWORK)


def test_the_repo_has_pairs_of_every_topology() -> None:
    topologies = {load_profile(p, REPO / "profiles").topology for p, _ in PAIRS}
    assert topologies == {"colocated", "same-host", "cross-host"}
    assert any("lab" in inv.name for _, inv in PAIRS) and any("examples" in inv.parts for _, inv in PAIRS)


@pytest.mark.parametrize(("profile", "inventory"), PAIRS, ids=lambda v: v if isinstance(v, str) else v.name)
def test_instances_are_the_pools_on_their_groups_hosts(profile: str, inventory: Path) -> None:
    prof, inv, topo = _load(profile, inventory)
    pools = [pool for pool, _ in prof.pools.items()]
    expected = {(h.name, pool) for h in inv.hosts.values() for pool in pools if h.in_group(pool)}
    assert {(i.host, i.pool) for i in topo.instances} == expected
    for inst in topo.instances:
        spec, host = prof.pools.get(inst.pool), inv.hosts[inst.host]
        assert (inst.port, inst.gpus, inst.address) == (spec.port, tuple(spec.gpus), host.address)
        assert inst.url == f"http://{host.address}:{spec.port}" and inst.health_url == inst.url + "/health"
        assert inst.unit == f"vllm-{inst.pool}.service"
        assert inst.env_file == f"/etc/pdfleet/vllm-{inst.pool}.env"
        assert inst.unit_path == f"/etc/systemd/system/vllm-{inst.pool}.service"
        assert (inst.kv_role is None) == (inst.pool == "colocated")
    for name in inv.hosts:
        ports = [p for i in topo.on_host(name) for p in (i.port, i.side_channel_port) if p is not None]
        assert len(ports) == len(set(ports)), f"{name}: a port twice in {ports}"


@pytest.mark.parametrize(("profile", "inventory"), PAIRS, ids=lambda v: v if isinstance(v, str) else v.name)
def test_gateways_route_between_the_pools(profile: str, inventory: Path) -> None:
    prof, inv, topo = _load(profile, inventory)
    pd = prof.pools.prefill is not None and prof.pools.decode is not None
    if prof.pools.colocated is None:
        assert topo.gateways == () and topo.no_gateway_reason
        return
    assert topo.no_gateway_reason is None
    assert [g.host for g in topo.gateways] == [h.name for h in inv.group("gateway")]
    for gw in topo.gateways:
        assert gw.url == f"http://{inv.hosts[gw.host].address}:{prof.gateway.port}"
        assert gw.router_url == (f"http://{ROUTER_ADDRESS}:{prof.gateway.router_port}" if pd else None)
        assert topo.gateway_on(gw.host) == gw
    assert topo.pool_urls("colocated") == [i.url for i in topo.instances if i.pool == "colocated"]


@pytest.mark.parametrize(("profile", "inventory"), PAIRS, ids=lambda v: v if isinstance(v, str) else v.name)
def test_every_service_has_one_metrics_endpoint(profile: str, inventory: Path) -> None:
    prof, _, topo = _load(profile, inventory)
    endpoints = topo.metrics_endpoints
    vllm = [e for e in endpoints if e.job == "vllm"]
    assert [(e.host, e.port) for e in vllm] == [(i.host, i.port) for i in topo.instances]
    for e in vllm:
        assert e.labels["pool"] == ("colocated" if e.labels["role"] == "colocated" else "disagg")
        assert e.url == f"http://{e.address}:{e.port}/metrics"
    assert [e.host for e in endpoints if e.job == "pdfleet-gateway"] == [g.host for g in topo.gateways]
    routers = [e for e in endpoints if e.job == "vllm-router"]
    assert [e.host for e in routers] == [g.host for g in topo.gateways if g.router_url]
    assert all(
        e.address == topo.gateway_on(e.host).address and e.port == prof.gateway.router_prometheus_port
        for e in routers
    )
    assert len({(e.host, e.address, e.port) for e in endpoints}) == len(endpoints)


@pytest.mark.parametrize(("profile", "inventory"), PAIRS, ids=lambda v: v if isinstance(v, str) else v.name)
def test_lab_hosts_and_hosts_running_pdfleet(profile: str, inventory: Path) -> None:
    prof, inv, topo = _load(profile, inventory)
    lab = inventory.name.startswith("lab")
    assert topo.lab_hosts == (frozenset(inv.hosts) if lab else frozenset())
    assert build_topology(prof, inv).lab_hosts == frozenset()  # no lab network given: nothing is a lab host
    expected = {g.host for g in topo.gateways}
    if prof.vllm.engine == "sim":
        expected |= {i.host for i in topo.instances}
    if topo.controller is not None:  # the rollout controller is host code too
        expected.add(topo.controller.host.name)
    assert topo.pdfleet_hosts == expected


@pytest.mark.parametrize(("profile", "inventory"), PAIRS, ids=lambda v: v if isinstance(v, str) else v.name)
def test_prometheus_on_every_monitoring_host_and_the_controller_on_the_first(
    profile: str, inventory: Path
) -> None:
    prof, inv, topo = _load(profile, inventory)
    hosts = inv.group("monitoring")
    assert [(p.host, p.address, p.port) for p in topo.monitoring] == [
        (h.name, h.address, prof.monitoring.port) for h in hosts
    ]
    for server in topo.monitoring:
        assert server.url == f"http://{server.address}:{prof.monitoring.port}"
        assert server.ready_url == server.url + "/-/ready" and topo.prometheus_on(server.host) == server
    assert topo.prometheus == (topo.monitoring[0] if hosts else None)
    installs = bool(hosts and topo.gateways and prof.rollout.plans)
    assert (topo.controller is not None) == installs == (topo.no_controller_reason is None)
    if topo.controller is not None:
        assert topo.controller.host == hosts[0]
    for gw in topo.gateways:
        port = prof.gateway.admin_port or prof.gateway.port
        assert gw.admin_url == f"http://{inv.hosts[gw.host].address}:{port}"


def test_the_monitoring_port_and_admin_port_come_from_the_profile() -> None:
    prof, inv, _ = _load("lab-cross", REPO / "inventory/lab.yml")
    prof = prof.model_copy(
        update={
            "monitoring": prof.monitoring.model_copy(update={"port": 9191}),
            "gateway": prof.gateway.model_copy(update={"admin_port": 8181}),
        }
    )
    topo = build_topology(prof, inv, LAB_NETWORK)
    assert topo.prometheus is not None and topo.prometheus.url == "http://198.18.0.10:9191"
    assert topo.prometheus.metrics_endpoint.url == "http://198.18.0.10:9191/metrics"
    assert [g.admin_url for g in topo.gateways] == ["http://198.18.0.10:8181"]


def test_why_there_is_no_controller() -> None:
    prof, inv, topo = _load("lab-cross", REPO / "inventory/lab.yml")
    assert topo.controller is not None and topo.controller.state_dir == "/var/lib/pdfleet/rollout"
    no_plans = prof.model_copy(update={"rollout": prof.rollout.model_copy(update={"plans": {}})})
    assert build_topology(no_plans, inv).no_controller_reason == "the profile has no rollout.plans"
    no_gateway = dataclasses.replace(inv, groups={k: v for k, v in inv.groups.items() if k != "gateway"})
    assert "no gateway" in (build_topology(prof, no_gateway).no_controller_reason or "")
    no_monitoring = dataclasses.replace(
        inv, groups={k: v for k, v in inv.groups.items() if k != "monitoring"}
    )
    topo = build_topology(prof, no_monitoring)
    assert topo.controller is None and topo.prometheus is None and topo.monitoring == ()
    assert "no host in the `monitoring` group" in (topo.no_controller_reason or "")


def test_same_host_instances_get_distinct_side_channel_ports_and_gpus() -> None:
    _, _, topo = _load("same-host-pcie", REPO / "inventory/examples/same-host-pcie.yml")
    for host in {i.host for i in topo.instances if i.pool != "colocated"}:
        prefill, decode = topo.on_host(host)
        assert (prefill.pool, decode.pool) == ("prefill", "decode")
        assert prefill.side_channel_port != decode.side_channel_port
        assert not set(prefill.gpus) & set(decode.gpus)
        assert prefill.side_channel_host == decode.side_channel_host == prefill.address


def test_cross_rdma_router_sees_every_prefill_and_decode() -> None:
    _, _, topo = _load("lab-cross", REPO / "inventory/lab.yml")
    assert topo.pool_urls("prefill") == ["http://198.18.0.21:8100"]
    assert topo.pool_urls("decode") == ["http://198.18.0.31:8200"]
    [gw] = topo.gateways
    assert (gw.host, gw.router_url) == ("lab-gw", "http://127.0.0.1:8090")

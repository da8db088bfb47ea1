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
from pdfleet.model.served import pool_hosts
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
    expected = {
        (h.name, pool, spec.name)
        for spec in prof.served
        for pool, _ in spec.pools.items()
        for h in pool_hosts(inv, spec, pool)
    }
    assert {(i.host, i.pool, i.model) for i in topo.instances} == expected
    for inst in topo.instances:
        served = prof.served_model(inst.model)
        spec, host = served.pools.get(inst.pool), inv.hosts[inst.host]
        assert (inst.port, inst.gpus, inst.address) == (spec.port, tuple(spec.gpus), host.address)
        assert inst.url == f"http://{host.address}:{spec.port}" and inst.health_url == inst.url + "/health"
        stem = f"vllm-{inst.model}-{inst.pool}" if prof.models else f"vllm-{inst.pool}"
        assert inst.unit == f"{stem}.service" and inst.listed == bool(prof.models)
        assert inst.env_file == f"/etc/pdfleet/{stem}.env"
        assert inst.unit_path == f"/etc/systemd/system/{stem}.service"
        assert (inst.kv_role is None) == (inst.pool == "colocated")
    for name in inv.hosts:
        ports = [p for i in topo.on_host(name) for p in (i.port, i.side_channel_port) if p is not None]
        assert len(ports) == len(set(ports)), f"{name}: a port twice in {ports}"
        assert len({i.unit for i in topo.on_host(name)}) == len(topo.on_host(name))


@pytest.mark.parametrize(("profile", "inventory"), PAIRS, ids=lambda v: v if isinstance(v, str) else v.name)
def test_gateways_route_between_the_pools(profile: str, inventory: Path) -> None:
    prof, inv, topo = _load(profile, inventory)
    if any(spec.pools.colocated is None for spec in prof.served):
        assert topo.gateways == () and topo.no_gateway_reason
        return
    assert topo.no_gateway_reason is None
    assert [g.host for g in topo.gateways] == [h.name for h in inv.group("gateway")]
    first_pd = next((spec for spec in prof.served if spec.has_router), None)
    scheme = "http" if prof.gateway.tls == "off" else "https"
    for gw in topo.gateways:
        assert gw.scheme == scheme and (gw.ca_file is None) == (scheme == "http")
        assert gw.url == f"{scheme}://{inv.hosts[gw.host].address}:{prof.gateway.port}"
        router = None if first_pd is None else f"http://{ROUTER_ADDRESS}:{first_pd.gateway.router_port}"
        assert gw.router_url == router
        assert topo.gateway_on(gw.host) == gw
        routers = topo.routers_on(gw.host)
        assert [r.model for r in routers] == [spec.name for spec in prof.served if spec.has_router]
        assert len({r.port for r in routers}) == len(routers) and len({r.unit for r in routers}) == len(
            routers
        )
    assert topo.pool_urls("colocated") == [i.url for i in topo.instances if i.pool == "colocated"]
    for spec, model in zip(prof.served, topo.models, strict=True):
        assert (model.name, model.aliases, model.disaggregated) == (
            spec.name,
            tuple(spec.aliases),
            spec.has_router,
        )
        assert model.pool_urls("colocated") == topo.pool_urls("colocated", spec.name)
        assert len(model.routers) == (len(topo.gateways) if spec.has_router else 0)


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
    assert [e.labels["model"] for e in vllm] == [i.model for i in topo.instances]
    routers = [e for e in endpoints if e.job == "vllm-router"]
    assert [(e.host, e.labels["model"]) for e in routers] == [
        (g.host, r.model) for g in topo.gateways for r in topo.routers_on(g.host)
    ]
    addresses = {g.host: g.address for g in topo.gateways}
    assert all(
        e.address == addresses[e.host]
        and e.port == prof.served_model(e.labels["model"]).gateway.router_prometheus_port
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
    installs = bool(hosts and topo.gateways and any(spec.rollout.plans for spec in prof.served))
    assert (topo.controller is not None) == installs == (topo.no_controller_reason is None)
    if topo.controller is not None:
        assert topo.controller.host == hosts[0]
    for gw in topo.gateways:
        port = prof.gateway.admin_port or prof.gateway.port
        assert gw.admin_url == f"{gw.scheme}://{inv.hosts[gw.host].address}:{port}"


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
    assert [g.admin_url for g in topo.gateways] == ["https://198.18.0.10:8181"]
    assert [g.ca_file for g in topo.gateways] == ["/var/lib/pdfleet-lab/tls/ca.crt"]


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


def test_two_models_share_the_lab_one_router_for_the_pd_model() -> None:
    _, _, topo = _load("lab-two-models", REPO / "inventory/lab.yml")
    big, small = topo.models
    assert (big.name, big.aliases, big.disaggregated) == ("llama-8b", ("llama-3.1-8b",), True)
    assert (small.name, small.aliases, small.disaggregated) == ("llama-1b", ("llama-3.2-1b",), False)
    assert small.pool_urls("colocated") == ["http://198.18.0.12:8001"] and small.routers == ()
    assert big.pool_urls("colocated") == ["http://198.18.0.11:8000", "http://198.18.0.12:8000"]
    assert [i.unit for i in topo.on_host("lab-colo2")] == [
        "vllm-llama-8b-colocated.service",
        "vllm-llama-1b-colocated.service",
    ]
    assert [i.gpus for i in topo.on_host("lab-colo2")] == [(0,), (1,)]
    [router] = topo.routers_on("lab-gw")
    assert (router.model, router.unit, router.url) == (
        "llama-8b",
        "vllm-router-llama-8b-pd.service",
        big.routers[0].url,
    )
    assert topo.pool("colocated", "llama-1b") == list(small.instances) and len(topo.pool("colocated")) == 3
    assert topo.model() is big and topo.model("llama-1b") is small
    with pytest.raises(KeyError, match="no model 'x'; models: llama-8b, llama-1b"):
        topo.model("x")

"""The gateway role: the host wheel reaches gateway hosts by upload, not through the site's index; the router
unit selects workers by the profile's policy, in flags the real vllm-router parses."""

from __future__ import annotations

import argparse
import dataclasses
import shutil
from pathlib import Path
from typing import Any

import pytest
from vllm_router.launch_router import parse_router_args
from vllm_router.router_args import RouterArgs

import roles.gateway as gateway_role
from pdfleet.errors import PdfleetError
from pdfleet.fleet.deployment import Deployment
from pdfleet.fleet.gateway_tls import tls_material
from pdfleet.fleet.host_wheel import wheel_name
from pdfleet.fleet.provision import render_fleet
from pdfleet.gateway.limits import check_limit_names
from pdfleet.gateway.policy import parse_policy
from pdfleet.lab import pki
from pdfleet.model.limits import KeyLimits, LimitsSpec
from pdfleet.model.profile import ROUTER_POLICIES
from pdfleet.model.tls import GatewayTls
from pdfleet.ops.base import FakeFacts, Run
from pdfleet.ops.files import File, FileContent
from pdfleet.ops.pip import PipList, PipRequirements
from tests.unit.fleet.helpers import TEST_SECRETS, deploy, profile_inventory_pairs
from tests.unit.roles.helpers import REPO, deployment, exec_start_argv

pytestmark = pytest.mark.procs  # openssl makes the TLS tests' CA and certificate

ROUTER_UNIT_PATH = "/etc/systemd/system/vllm-router-pd.service"  # a single-model profile's router


def test_gateway_role_uploads_the_wheel_and_pip_installs_from_it(tmp_path: Path) -> None:
    fleet = deployment("lab-cross")
    wheel = tmp_path / wheel_name(fleet.host_version)
    wheel.write_bytes(b"PK-not-really-a-wheel")
    fleet = dataclasses.replace(fleet, host_wheel=wheel)
    host = fleet.inventory.hosts["lab-gw"]
    no_policy = {FileContent(gateway_role.POLICY_FILE): None}  # a new host: no policy yet
    ops = list(gateway_role.operations(fleet.context(host), FakeFacts(no_policy)))
    uploads = [op for op in ops if isinstance(op, File) and op.path == f"/opt/pdfleet/wheels/{wheel.name}"]
    assert len(uploads) == 1 and uploads[0].content == wheel.read_bytes() and uploads[0].mode == "0644"
    pips = [op for op in ops if isinstance(op, PipRequirements) and op.venv == "/opt/pdfleet/gateway"]
    assert len(pips) == 1
    assert ops.index(uploads[0]) < ops.index(pips[0])  # the file is there before pip looks for it
    (change,) = [c for c in pips[0].plan(FakeFacts({PipList(pips[0].venv): {}})) if "install" in c.diff]
    (cmd,) = [c.cmd for c in change.commands if isinstance(c, Run)]
    assert f"--find-links /opt/pdfleet/wheels pdfleet=={fleet.host_version}" in cmd.replace("'", "")
    # without a wheel (a site whose index serves it) nothing is uploaded
    plain = list(
        gateway_role.operations(
            dataclasses.replace(fleet, host_wheel=None).context(host), FakeFacts(no_policy)
        )
    )
    assert not any(isinstance(op, File) and op.path.startswith("/opt/pdfleet/wheels/") for op in plain)


def _router_argv(fleet: Deployment) -> list[list[str]]:
    """ExecStart of every router unit the deployment renders (one per gateway host of a P/D profile)."""
    rendered = render_fleet(fleet, fleet.inventory.hosts.values())
    units = [f for files in rendered.values() for f in files if f.path == ROUTER_UNIT_PATH]
    return [exec_start_argv(f.content) for f in units]


def _real_router_args(argv: list[str]) -> RouterArgs:
    """What vllm-router's own launcher makes of a rendered command line (parsed, validated, not started)."""
    assert argv[0].endswith("/bin/vllm-router")
    args = parse_router_args(argv[1:])
    args._validate_router_args()
    return args


def test_profile_policies_are_the_ones_the_installed_router_accepts() -> None:
    parser = argparse.ArgumentParser()
    RouterArgs.add_cli_args(parser)
    for flag in ("--policy", "--prefill-policy", "--decode-policy"):
        (action,) = [a for a in parser._actions if flag in a.option_strings]
        assert tuple(action.choices) == ROUTER_POLICIES, flag


@pytest.mark.parametrize(
    ("profile", "inventory"), profile_inventory_pairs(), ids=lambda v: getattr(v, "name", v)
)
def test_every_example_router_unit_selects_round_robin(profile: str, inventory: Path) -> None:
    """Each shipped profile on each inventory it fits: the router unit, where one is rendered, says
    round_robin for both pools (not the router's own cache_aware default), and the real parser agrees."""
    fleet = deploy(profile, inventory)
    for argv in _router_argv(fleet):
        assert argv[argv.index("--policy") + 1] == "round_robin"
        assert "--prefill-policy" not in argv and "--decode-policy" not in argv
        args = _real_router_args(argv)
        assert (args.policy, args.prefill_policy, args.decode_policy) == ("round_robin", None, None)
        assert args.vllm_pd_disaggregation


def test_some_example_renders_a_router_unit() -> None:
    """The test above checks something: lab-cross (P/D beside a colocated pool) renders a router unit."""
    lab_cross = [inv for p, inv in profile_inventory_pairs() if p == "lab-cross"]
    assert lab_cross and any(_router_argv(deploy("lab-cross", inv)) for inv in lab_cross)


def _lab_cross_with(tmp_path: Path, router_policy: str) -> Deployment:
    """lab-cross on the lab inventory, with `gateway.router_policy` set (YAML flow text)."""
    profiles = tmp_path / "profiles"
    shutil.copytree(REPO / "profiles", profiles)
    (profiles / "rp.yml").write_text(f"extends: lab-cross\ngateway: {{router_policy: {router_policy}}}\n")
    return deploy("rp", REPO / "inventory" / "lab.yml", profiles)


@pytest.mark.parametrize("name", ROUTER_POLICIES)
def test_one_policy_renders_one_policy_flag(tmp_path: Path, name: str) -> None:
    (argv,) = _router_argv(_lab_cross_with(tmp_path, name))
    assert argv[argv.index("--policy") + 1] == name and argv.count("--policy") == 1
    assert _real_router_args(argv).policy == name


def test_per_pool_policies_render_prefill_and_decode_flags(tmp_path: Path) -> None:
    (argv,) = _router_argv(_lab_cross_with(tmp_path, "{prefill: cache_aware, decode: power_of_two}"))
    assert "--policy" not in argv
    assert argv[argv.index("--prefill-policy") + 1] == "cache_aware"
    assert argv[argv.index("--decode-policy") + 1] == "power_of_two"
    args = _real_router_args(argv)
    assert (args.prefill_policy, args.decode_policy) == ("cache_aware", "power_of_two")


def _rendered_policy(fleet: Deployment) -> str:
    rendered = render_fleet(fleet, fleet.inventory.hosts.values())
    (policy,) = [f for files in rendered.values() for f in files if f.path == gateway_role.POLICY_FILE]
    return policy.content


def _lab_cross_gateway(tmp_path: Path, gateway_yaml: str, without_decider: bool = False) -> Deployment:
    """lab-cross with `gateway_yaml` over its gateway (`without_decider`: its own decider block left out)."""
    profiles = tmp_path / "profiles"
    shutil.copytree(REPO / "profiles", profiles)
    if without_decider:
        base = profiles / "lab-cross.yml"
        text = base.read_text()
        start = text.index("  decider:\n")
        end = text.index("\n", text.index("prefill_busy_waiting", start)) + 1
        base.write_text(text[:start] + text[end:])
    (profiles / "lim.yml").write_text(f"extends: lab-cross\ngateway: {gateway_yaml}\n")
    return deploy("lim", REPO / "inventory" / "lab.yml", profiles)


def test_profile_limits_reach_the_policy_and_the_gateway_accepts_them(tmp_path: Path) -> None:
    fleet = _lab_cross_gateway(
        tmp_path,
        "{limits: {default: {requests_per_second: 20, burst: 40, concurrent_streams: 64},"
        " keys: {admin: {requests_per_second: 100}}, model_max_prompt_tokens: 30000}}",
    )
    text = _rendered_policy(fleet)
    spec = parse_policy(Path("policy.yaml"), text)  # the gateway's own schema
    alias = fleet.profile.gateway.model_alias or fleet.profile.model.id
    assert spec.limits.default == KeyLimits(requests_per_second=20, burst=40, concurrent_streams=64)
    assert spec.limits.for_key("admin").requests_per_second == 100
    assert spec.limits.for_key("admin").concurrent_streams == 64
    assert spec.limits.models[alias].max_prompt_tokens == 30000
    assert check_limit_names(spec.limits, {"client", "admin"}, set(spec.models), "policy.yaml") == []


def test_no_profile_limits_render_no_limits_section(tmp_path: Path) -> None:
    text = _rendered_policy(_lab_cross_gateway(tmp_path, "{limits: {}}"))
    assert "limits:" not in text and parse_policy(Path("policy.yaml"), text).limits == LimitsSpec()


@pytest.mark.parametrize(
    ("gateway_yaml", "expected"),
    [
        ("{limits: {keys: {user: {burst: 1}}}}", "gateway.limits.keys.user"),
        ("{limits: {default: {requests_per_second: 0}}}", "gateway.limits.default.requests_per_second"),
        ("{limits: {default: {rps: 1}}}", "gateway.limits.default.rps: unknown key"),
        ("{limits: {model_max_prompt_tokens: 0}}", "gateway.limits.model_max_prompt_tokens"),
    ],
)
def test_bad_profile_limits_name_the_key_path(tmp_path: Path, gateway_yaml: str, expected: str) -> None:
    with pytest.raises(PdfleetError) as exc:
        _lab_cross_gateway(tmp_path, gateway_yaml)
    assert expected in str(exc.value)


def test_profile_decider_reaches_the_policy_with_the_pd_instances_to_scrape(tmp_path: Path) -> None:
    fleet = _lab_cross_gateway(
        tmp_path,
        "{decider: {threshold_on: effective, colocated_choice: prefix_load, prefill_busy_waiting: 8}}",
    )
    spec = parse_policy(Path("policy.yaml"), _rendered_policy(fleet))  # the gateway's own schema
    assert (spec.decider.threshold_on, spec.decider.colocated_choice) == ("effective", "prefix_load")
    assert spec.decider.prefill_busy_waiting == 8 and spec.decider.decode_busy_waiting is None
    model = fleet.topology.model()
    (route,) = [r for r in spec.models.values() if r.disagg is not None]
    assert route.prefill == model.pool_urls("prefill") and route.prefill
    assert route.decode == []  # no decode bound: nothing scraped there


def test_no_profile_decider_renders_the_policy_as_before(tmp_path: Path) -> None:
    text = _rendered_policy(_lab_cross_gateway(tmp_path, "{}", without_decider=True))
    assert "decider:" not in text and "prefill:" not in text


@pytest.mark.parametrize(
    ("gateway_yaml", "expected"),
    [
        ("{decider: {colocated_choice: random}}", "gateway.decider.colocated_choice"),
        ("{decider: {poll_s: 5}}", "gateway.decider.poll_s"),
        ("{decider: {stale_s: 0.5}}", "stale_s (0.5) must exceed poll_s (1)"),
        ("{decider: {prefill_busy: 3}}", "gateway.decider.prefill_busy: unknown key"),
    ],
)
def test_bad_profile_decider_names_the_key_path(tmp_path: Path, gateway_yaml: str, expected: str) -> None:
    with pytest.raises(PdfleetError) as exc:
        _lab_cross_gateway(tmp_path, gateway_yaml)
    assert expected in str(exc.value)


def test_profile_shadow_bounds_and_capture_reach_the_policy(tmp_path: Path) -> None:
    fleet = _lab_cross_gateway(
        tmp_path,
        "{shadow: {max_in_flight: 2, pd_waiting_max: null}, capture: {path: capture.jsonl, files: 2}}",
    )
    spec = parse_policy(Path("policy.yaml"), _rendered_policy(fleet))  # the gateway's own schema
    assert (spec.shadow.max_in_flight, spec.shadow.pd_waiting_max) == (2, None)
    assert (spec.capture.path, spec.capture.files) == ("capture.jsonl", 2)


def test_the_profiles_stall_is_the_gateways(tmp_path: Path) -> None:
    """slo.stall_ms (lab-cross: 250) is the gateway's stall_threshold_ms, so its stall counters (and the
    stalls caused by long prefills) count what the bench counts; the default renders nothing new."""
    fleet = _lab_cross_gateway(tmp_path, "{}")
    assert fleet.profile.slo.stall_ms == 250
    assert parse_policy(Path("policy.yaml"), _rendered_policy(fleet)).stall_threshold_ms == 250
    (tmp_path / "profiles" / "dflt.yml").write_text("extends: lab-cross\nslo: {stall_ms: 500}\n")
    default = deploy("dflt", REPO / "inventory" / "lab.yml", tmp_path / "profiles")
    assert "stall_threshold_ms" not in _rendered_policy(default)


def test_no_profile_shadow_or_capture_renders_the_policy_as_before(tmp_path: Path) -> None:
    text = _rendered_policy(_lab_cross_gateway(tmp_path, "{}"))
    assert "shadow:" not in text and "capture:" not in text


@pytest.mark.parametrize(
    ("gateway_yaml", "expected"),
    [
        ("{shadow: {max_in_flight: 0}}", "gateway.shadow.max_in_flight"),
        ("{capture: {max_bytes: 10}}", "gateway.capture.max_bytes"),
        ("{capture: {file: x}}", "gateway.capture.file: unknown key"),
    ],
)
def test_bad_profile_shadow_or_capture_names_the_key_path(
    tmp_path: Path, gateway_yaml: str, expected: str
) -> None:
    with pytest.raises(PdfleetError) as exc:
        _lab_cross_gateway(tmp_path, gateway_yaml)
    assert expected in str(exc.value)


def _tls_fleet(tmp_path: Path, profile: str = "lab-cross") -> Deployment:
    """A TLS lab profile with a real CA and certificate in `tmp_path` as its site PKI."""
    ca = pki.make_ca(tmp_path / "pki")
    pair = pki.issue(ca, tmp_path / "pki", "gateway", ["lab-gw"], ["198.18.0.10"])
    setting = GatewayTls(cert_file=str(pair.cert), key_file=str(pair.key), ca_file=str(ca.cert))
    secrets = dataclasses.replace(TEST_SECRETS, tls=tls_material(setting))
    return deploy(profile, REPO / "inventory/lab.yml", secrets=secrets)


def _notified(ops: list[Any], path: str) -> list[str]:
    (op,) = [o for o in ops if isinstance(o, File) and o.path == path]
    return [h.name for h in op.notify]


def test_tls_pushes_the_pair_and_ca_and_a_renewal_reloads_a_toggle_restarts(tmp_path: Path) -> None:
    fleet = _tls_fleet(tmp_path)
    host = fleet.inventory.hosts["lab-gw"]
    ctx = fleet.context(host)
    files = {f.path: f for f in gateway_role.files(ctx)}
    key = files[gateway_role.TLS_KEY_FILE]
    assert key.mode == "0600" and key.secret and key.owner == "pdfleet"
    assert files["/etc/pdfleet/tls/gateway-ca.crt"].mode == "0644"
    tls_policy = files[gateway_role.POLICY_FILE].content
    assert "cert_file: /etc/pdfleet/gateway/tls.crt" in tls_policy
    assert [u.health_url for u in gateway_role.units(ctx)][-1] == "https://198.18.0.10:8080/health"
    # the host runs a TLS policy: a renewed certificate reloads (no stream dropped)
    live = FakeFacts({FileContent(gateway_role.POLICY_FILE): tls_policy})
    ops = list(gateway_role.operations(ctx, live))
    assert _notified(ops, gateway_role.TLS_CERT_FILE) == ["reload pdfleet-gateway.service"]
    # the host runs a plain policy: turning TLS on restarts (a reload cannot rebind the sockets)
    plain = deploy("lab-cross-plain", REPO / "inventory/lab.yml")
    plain_policy = {f.path: f for f in gateway_role.files(plain.context(host))}[gateway_role.POLICY_FILE]
    ops = list(
        gateway_role.operations(ctx, FakeFacts({FileContent(gateway_role.POLICY_FILE): plain_policy.content}))
    )
    assert _notified(ops, gateway_role.TLS_CERT_FILE) == ["restart pdfleet-gateway.service"]
    # and back: the plain profile on a TLS host restarts too
    ops = list(gateway_role.operations(plain.context(host), live))
    assert _notified(ops, gateway_role.POLICY_FILE) == ["restart pdfleet-gateway.service"]


def test_kv_events_reach_each_colocated_and_prefill_unit_and_the_policy(tmp_path: Path) -> None:
    fleet = _lab_cross_gateway(
        tmp_path,
        "{decider: {colocated_choice: prefix_load, cache_source: kv_events, prefill_busy_waiting: 8}}",
    )
    spec = parse_policy(Path("policy.yaml"), _rendered_policy(fleet))  # the gateway's own schema
    colocated = fleet.topology.model().pool("colocated")
    (route,) = [r for r in spec.models.values() if r.disagg is not None]
    assert route.colocated == [i.url for i in colocated] and len(colocated) == 2
    assert route.kv_events == [f"tcp://{i.address}:5557" for i in colocated]
    assert route.kv_events_release == fleet.profile.vllm.version
    prefill = fleet.topology.model().pool("prefill")  # the P/D candidate's facts: its prefill instances'
    assert route.prefill == [i.url for i in prefill] and prefill
    assert route.prefill_kv_events == [f"tcp://{i.address}:5657" for i in prefill]
    # each publisher's replay socket (vLLM's replay_endpoint), where the gateway closes a sequence gap
    assert route.kv_events_replay == [f"tcp://{i.address}:5757" for i in colocated]
    assert route.prefill_kv_events_replay == [f"tcp://{i.address}:5857" for i in prefill]
    assert route.prefill_cache_aware is False  # the profile's prefill policy: round_robin
    assert spec.decider.cache_source == "index"  # in a policy the source is each alias's
    rendered = render_fleet(fleet, fleet.inventory.hosts.values())
    ports = {"colocated": (5557, 5757), "prefill": (5657, 5857)}
    for inst in fleet.topology.instances:  # the colocated and prefill units publish, decode ones do not
        (unit,) = [f for f in rendered[inst.host] if f.path == inst.unit_path]
        argv = exec_start_argv(unit.content)
        assert ("--kv-events-config" in argv) == (inst.pool in ports), inst
        if inst.pool in ports:
            config = argv[argv.index("--kv-events-config") + 1]
            endpoint, replay = (f"tcp://*:{port}" for port in ports[inst.pool])
            assert config == (
                f'{{"enable_kv_cache_events":true,"endpoint":"{endpoint}","publisher":"zmq",'
                f'"replay_endpoint":"{replay}"}}'
            )


def test_a_profile_without_kv_events_renders_no_events_endpoints(tmp_path: Path) -> None:
    fleet = _lab_cross_gateway(tmp_path, "{decider: {colocated_choice: prefix_load}}")
    text = _rendered_policy(fleet)
    assert "kv_events" not in text and "cache_source" not in text
    assert all(i.kv_events_port is None for i in fleet.topology.instances)


@pytest.mark.parametrize(
    ("gateway_yaml", "expected"),
    [
        (
            "{decider: {cache_source: kv_events}}",
            "gateway.decider.cache_source: kv_events: nothing reads the cache facts",
        ),
        ("{decider: {cache_source: events}}", "gateway.decider.cache_source"),
    ],
)
def test_bad_kv_events_settings_name_the_key_path(tmp_path: Path, gateway_yaml: str, expected: str) -> None:
    with pytest.raises(PdfleetError) as exc:
        _lab_cross_gateway(tmp_path, gateway_yaml)
    assert expected in str(exc.value) and "lim.yml" in str(exc.value)

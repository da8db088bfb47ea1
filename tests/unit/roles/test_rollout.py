"""The rollout role: on the monitoring host, controller.json the controller itself accepts (the
profile's plans and every gateway's admin URL), the stage-only key in a 0600 file of the service user
(controller.json's stage_key_file), a unit whose command line pdfleet-rollout parses; no key, no
controller (a Skip saying why)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import roles.rollout as rollout_role
from pdfleet.fleet.secrets import GatewaySecrets
from pdfleet.ops.base import FakeFacts, Skip
from pdfleet.rollout.cli import _parser
from pdfleet.rollout.config import load_configs
from tests.unit.roles.helpers import deployment, exec_start_argv

KEY = "sk-pdfleet-test-controller-key"  # the stage-only key: the admin key never reaches the host


def _monitoring(fleet):
    return next(h for h in fleet.inventory.hosts.values() if h.in_group("monitoring"))


def test_the_controller_gets_its_config_key_and_unit(tmp_path: Path) -> None:
    fleet = deployment("lab-cross")
    fleet = dataclasses.replace(fleet, gateway_secrets=GatewaySecrets("1" * 64, "2" * 64, KEY))
    ctx = fleet.context(_monitoring(fleet))
    controller = fleet.topology.controller
    assert controller is not None and controller.host.name == ctx.host.name
    by_path = {f.path: f for f in rollout_role.files(ctx)}
    assert set(by_path) == {
        "/etc/pdfleet/rollout/controller.json",
        "/etc/pdfleet/rollout/admin.key",
        "/etc/systemd/system/pdfleet-rollout.service",
    }  # no CA: these secrets carry no TLS files (test_gateway_tls covers the CA)
    local = tmp_path / "controller.json"
    local.write_text(by_path[controller.config_file].content)
    (config,) = load_configs(local)
    assert (config.name, config.group, config.model) == ("llama-3-1-8b", None, None)
    assert [g.admin_url for g in config.gateways] == [g.admin_url for g in fleet.topology.gateways]
    assert [g.admin_url for g in config.gateways] == ["https://198.18.0.10:8080"]
    assert config.gateway_ca_file == "/etc/pdfleet/tls/gateway-ca.crt"  # lab-cross speaks TLS
    assert config.prometheus_url == f"http://198.18.0.10:{fleet.profile.monitoring.port}"
    assert set(config.rollout.plans) == {"canary-long", "long-prompts", "all-disagg"}
    assert config.initial_stage == "colocated" and config.state_dir == "/var/lib/pdfleet/rollout"
    assert KEY not in by_path[controller.config_file].content
    key = by_path[controller.key_file]
    assert (key.content, key.mode, key.owner, key.secret) == (KEY + "\n", "0600", "pdfleet", True)
    unit = by_path[f"/etc/systemd/system/{controller.unit}"].content
    argv = exec_start_argv(unit)
    args = _parser().parse_args(argv[1:])
    assert (argv[0], str(args.config), args.command) == (controller.bin, controller.config_file, "run")
    assert argv[0] == "/opt/pdfleet/rollout/bin/pdfleet-rollout"
    assert "StateDirectory=pdfleet/rollout" in unit and KEY not in unit
    assert config.stage_key_file == controller.key_file


def test_without_the_controller_key_the_role_skips_saying_why() -> None:
    fleet = deployment("lab-cross")  # the test secrets carry hashes only
    ctx = fleet.context(_monitoring(fleet))
    ops = list(rollout_role.operations(ctx, FakeFacts()))
    assert len(ops) == 1 and isinstance(ops[0], Skip) and "controller key" in ops[0].reason
    assert rollout_role.files(ctx) == [] and rollout_role.units(ctx) == []


def test_each_model_of_a_models_profile_gets_its_part(tmp_path: Path) -> None:
    """lab-two-models: each model stages its own policy group and measures its own series (model label)
    against its own SLO and plans; only the P/D one reads its connector's KV series."""
    fleet = deployment("lab-two-models")
    fleet = dataclasses.replace(fleet, gateway_secrets=GatewaySecrets("1" * 64, "2" * 64, KEY))
    ctx = fleet.context(_monitoring(fleet))
    local = tmp_path / "controller.json"
    local.write_text(next(f for f in rollout_role.files(ctx) if f.path.endswith("controller.json")).content)
    big, small = load_configs(local)
    assert (big.name, big.group, big.model) == ("llama-8b", "llama-8b", "llama-8b")
    assert (small.name, small.group, small.model) == ("llama-1b", "llama-1b", "llama-1b")
    assert set(big.rollout.plans) == {"canary-long", "long-prompts", "all-disagg"}
    assert big.kv_transfer_metrics and not small.kv_transfer_metrics  # colocated: no KV connector
    assert (big.slo["ttft_p99_ms"], small.slo["ttft_p99_ms"]) == (fleet.profile.slo.ttft_p99_ms, 1000)
    assert big.gateways == small.gateways and big.state_dir == small.state_dir

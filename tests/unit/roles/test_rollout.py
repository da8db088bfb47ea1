"""The rollout role: on the monitoring host, controller.json the controller itself accepts (the
profile's plans and every gateway's admin URL), the admin key in a 0600 file of the service user, a
unit whose command line pdfleet-rollout parses; no key, no controller (a Skip saying why)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import roles.rollout as rollout_role
from pdfleet.fleet.secrets import GatewaySecrets
from pdfleet.ops.base import FakeFacts, Skip
from pdfleet.rollout.cli import _parser
from pdfleet.rollout.config import load_config
from tests.unit.roles.helpers import deployment, exec_start_argv

KEY = "sk-pdfleet-test-admin-key"


def _monitoring(fleet):
    return next(h for h in fleet.inventory.hosts.values() if h.in_group("monitoring"))


def test_the_controller_gets_its_config_key_and_unit(tmp_path: Path) -> None:
    fleet = deployment("lab-cross")
    fleet = dataclasses.replace(fleet, gateway_secrets=GatewaySecrets("1" * 64, "2" * 64, KEY))
    ctx = fleet.context(_monitoring(fleet))
    by_path = {f.path: f for f in rollout_role.files(ctx)}
    assert set(by_path) == {
        rollout_role.CONFIG_FILE,
        rollout_role.KEY_FILE,
        f"/etc/systemd/system/{rollout_role.UNIT}",
    }
    local = tmp_path / "controller.json"
    local.write_text(by_path[rollout_role.CONFIG_FILE].content)
    config = load_config(local)
    assert [g.admin_url for g in config.gateways] == [
        f"http://{g.address}:{g.admin_port or g.port}" for g in fleet.topology.gateways
    ]
    assert set(config.rollout.plans) == {"canary-long", "long-prompts", "all-disagg"}
    assert config.initial_stage == "colocated" and config.state_dir == "/var/lib/pdfleet/rollout"
    assert KEY not in by_path[rollout_role.CONFIG_FILE].content
    key = by_path[rollout_role.KEY_FILE]
    assert (key.content, key.mode, key.owner, key.secret) == (KEY + "\n", "0600", "pdfleet", True)
    unit = by_path[f"/etc/systemd/system/{rollout_role.UNIT}"].content
    argv = exec_start_argv(unit)
    args = _parser().parse_args(argv[1:])
    assert (argv[0], str(args.config), args.command) == (rollout_role.BIN, rollout_role.CONFIG_FILE, "run")
    assert "StateDirectory=pdfleet/rollout" in unit and KEY not in unit
    assert json.loads(by_path[rollout_role.CONFIG_FILE].content)["admin_key_file"] == rollout_role.KEY_FILE


def test_without_the_admin_key_the_role_skips_saying_why() -> None:
    fleet = deployment("lab-cross")  # the test secrets carry hashes only
    ctx = fleet.context(_monitoring(fleet))
    ops = list(rollout_role.operations(ctx, FakeFacts()))
    assert len(ops) == 1 and isinstance(ops[0], Skip) and "admin key" in ops[0].reason
    assert rollout_role.files(ctx) == [] and rollout_role.units(ctx) == []

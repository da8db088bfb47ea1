"""The profile's outside aliases on a gateway host: routes in the one policy beside the served model's
alias, the key in a 0600 secret file the policy names, an alias clash refused with its key path."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from pdfleet.errors import ValidationError
from pdfleet.fleet.provision import render_fleet
from pdfleet.fleet.secrets import GatewaySecrets
from pdfleet.gateway.policy import parse_policy
from pdfleet.model.outside import OutsideAlias
from roles.gateway import CONFIG_DIR, POLICY_FILE
from roles.gateway.outside import key_path, outside_files, outside_routes
from tests.unit.fleet.helpers import REPO, deploy

HOSTED_KEY = "sk-hosted-provider-0123456789"
OUTSIDE = {
    "gpt-4o": {"api": "openai", "base_url": "http://198.18.0.30:8000", "upstream_model": "hosted-gpt"},
    "claude": {"api": "anthropic", "base_url": "https://api.example.com/anth", "upstream_model": "c-4"},
}


def _profiles(tmp_path: Path, outside: dict[str, dict[str, str]]) -> Path:
    """The repo's profiles plus `lab-outside`: lab-cross with these outside aliases."""
    profiles = tmp_path / "profiles"
    shutil.copytree(REPO / "profiles", profiles)
    with_keys = {a: {**o, "key_file": str(tmp_path / f"{a}.key")} for a, o in outside.items()}
    doc = {"extends": "lab-cross", "gateway": {"outside": with_keys}}
    (profiles / "lab-outside.yml").write_text(yaml.safe_dump(doc))
    return profiles


def test_outside_aliases_render_into_the_one_policy_with_their_key_files(tmp_path: Path) -> None:
    keys = {"gpt-4o": HOSTED_KEY, "claude": "sk-ant-hosted-9876"}
    secrets = GatewaySecrets("1" * 64, "2" * 64, outside_keys=keys)
    fleet = deploy("lab-outside", REPO / "inventory/lab.yml", _profiles(tmp_path, OUTSIDE), secrets=secrets)
    files = {f.path: f for f in render_fleet(fleet, [fleet.inventory.hosts["lab-gw"]])["lab-gw"]}
    policy = parse_policy(Path(POLICY_FILE), files[POLICY_FILE].content)
    served = [a for a, r in policy.models.items() if r.outside is None]
    assert len(served) == 1 and policy.models[served[0]].disagg is not None
    gpt = policy.models["gpt-4o"]
    assert gpt.outside is not None and gpt.upstream_model == "hosted-gpt"
    assert (gpt.outside.api, gpt.outside.base_url) == ("openai", "http://198.18.0.30:8000")
    assert gpt.outside.key_file == f"{CONFIG_DIR}/outside-gpt-4o.key"
    key_file = files[gpt.outside.key_file]
    assert (key_file.content, key_file.mode, key_file.secret) == (HOSTED_KEY + "\n", "0600", True)
    assert key_file.owner == files[POLICY_FILE].owner != "root"
    assert HOSTED_KEY not in files[POLICY_FILE].content
    assert policy.models["claude"].outside.base_url == "https://api.example.com/anth"  # type: ignore[union-attr]


def test_the_profile_refuses_a_bad_outside_alias_with_its_key_path(tmp_path: Path) -> None:
    bad = {"gpt": {"api": "openai", "base_url": "https://api.example.com/v1", "upstream_model": "x"}}
    with pytest.raises(ValidationError, match=r"gateway\.outside\.gpt\.base_url.*ends with /v1"):
        deploy("lab-outside", REPO / "inventory/lab.yml", _profiles(tmp_path, bad))


def test_an_outside_alias_a_model_serves_too_is_refused() -> None:
    o = OutsideAlias(api="openai", base_url="https://api.example.com", upstream_model="m", key_file="k")
    with pytest.raises(ValidationError, match="gateway.outside.llama: the alias is also a served model's"):
        outside_routes({"llama": o}, ["llama"], CONFIG_DIR)
    assert outside_routes({"gpt": o}, ["llama"], "/etc/x") == {
        "gpt": {
            "outside": {
                "api": "openai",
                "base_url": "https://api.example.com",
                "key_file": "/etc/x/outside-gpt.key",
            },
            "upstream_model": "m",
        }
    }
    (f,) = outside_files({"gpt": "sk-1"}, "/etc/x", "pdfleet")
    assert (f.path, f.content, f.mode, f.owner, f.group, f.secret) == (
        key_path("/etc/x", "gpt"),
        "sk-1\n",
        "0600",
        "pdfleet",
        "pdfleet",
        True,
    )

"""The controller's configuration and key file: one configuration per model, each with the shared keys;
bad files are refused naming the file and key (a model or group twice, a file from before models or from
before `stage_key_file`); a key file others can read is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdfleet.errors import ValidationError
from pdfleet.rollout.config import load_configs, read_admin_key, read_key_file

MODEL = {
    "name": "big",
    "rollout": {},
    "stages": {"colocated": {"short": 0, "long": 0}},
    "initial_stage": "colocated",
    "slo": {"ttft_p99_ms": 1.0, "tpot_p99_ms": 1.0, "itl_p99_ms": 1.0, "kv_transfer_p99_ms": 1.0},
}
SMALL = {**MODEL, "name": "small", "group": "small", "model": "small"}
SHARED = {
    "profile": "p",
    "gateways": [{"name": "gw", "admin_url": "http://10.0.0.1:8080"}],
    "prometheus_url": "http://10.0.0.5:9090",
    "stage_key_file": "/etc/pdfleet/rollout/admin.key",
}
GOOD = {**SHARED, "models": [MODEL, SMALL]}


def _write(tmp_path: Path, doc: object) -> Path:
    path = tmp_path / "controller.json"
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return path


def test_a_good_config_loads_one_configuration_per_model(tmp_path: Path) -> None:
    big, small = load_configs(_write(tmp_path, GOOD))
    assert (big.name, big.group, big.model) == ("big", None, None)
    assert (small.name, small.group, small.model) == ("small", "small", "small")
    for config in (big, small):
        assert config.gateways[0].name == "gw" and config.state_dir == "/var/lib/pdfleet/rollout"


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ("{nope", "not JSON"),
        ({**GOOD, "models": [{**MODEL, "initial_stage": "x"}]}, "models[0].initial_stage: 'x' is not in"),
        (
            {**GOOD, "models": [MODEL, {**SMALL, "slo": {"ttft_p99_ms": 1.0}}]},
            "models[1].slo: lacks itl_p99_ms, kv_transfer_p99_ms, tpot_p99_ms",
        ),
        ({**GOOD, "models": [MODEL, {**SMALL, "name": "big"}]}, "models[1].name: 'big' is given to two"),
        (
            {**GOOD, "models": [MODEL, {**SMALL, "group": None}]},
            "models[1].group: null (the policy's top-level stage) is given",
        ),
        ({**GOOD, "models": [{**MODEL, "name": "Big Model"}]}, "models[0].name"),
        ({**GOOD, "models": []}, "models"),
        ({**GOOD, "gateways": [{"name": "gw", "admin_url": "http://h:1/path"}]}, "gateways[0].admin_url"),
        ({**GOOD, "colour": 1}, "colour"),
        ({**SHARED, **MODEL}, "models: missing (a file from before rollouts went by model); run invoke"),
        (
            {**{k: v for k, v in GOOD.items() if k != "stage_key_file"}, "admin_key_file": "/k"},
            "admin_key_file: renamed stage_key_file (it names the stage-only key's file); run invoke",
        ),
        ({k: v for k, v in GOOD.items() if k != "stage_key_file"}, "stage_key_file"),
    ],
)
def test_bad_configs_name_file_and_key(tmp_path: Path, doc: object, expected: str) -> None:
    with pytest.raises(ValidationError) as err:
        load_configs(_write(tmp_path, doc))
    assert expected in str(err.value) and "controller.json" in str(err.value)


def test_a_key_file_must_be_private_and_not_empty_and_its_errors_say_which_key(tmp_path: Path) -> None:
    key = tmp_path / "admin.key"
    key.write_text("sk-secret\n")
    key.chmod(0o600)
    assert read_admin_key(key) == "sk-secret"
    assert read_key_file(key, "stage key") == "sk-secret"
    key.chmod(0o644)
    with pytest.raises(ValidationError, match="the admin key file is readable by group or others") as err:
        read_admin_key(key)
    assert "sk-secret" not in str(err.value)
    with pytest.raises(ValidationError, match="the stage key file is readable by group or others") as err:
        read_key_file(key, "stage key")
    assert "sk-secret" not in str(err.value)
    key.write_text("\n")
    key.chmod(0o600)
    with pytest.raises(ValidationError, match="the stage key file is empty"):
        read_key_file(key, "stage key")
    with pytest.raises(ValidationError, match="cannot read the admin key file"):
        read_admin_key(tmp_path / "missing")

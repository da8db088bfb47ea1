"""The controller's configuration and admin key file: bad files are refused naming the file and key;
a key file others can read is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdfleet.errors import ValidationError
from pdfleet.rollout.config import load_config, read_admin_key

GOOD = {
    "profile": "p",
    "rollout": {},
    "stages": {"colocated": {"short": 0, "long": 0}},
    "initial_stage": "colocated",
    "slo": {"ttft_p99_ms": 1.0, "tpot_p99_ms": 1.0, "itl_p99_ms": 1.0, "kv_transfer_p99_ms": 1.0},
    "gateways": [{"name": "gw", "admin_url": "http://10.0.0.1:8080"}],
    "prometheus_url": "http://10.0.0.5:9090",
    "admin_key_file": "/etc/pdfleet/rollout/admin.key",
}


def _write(tmp_path: Path, doc: object) -> Path:
    path = tmp_path / "controller.json"
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return path


def test_a_good_config_loads(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, GOOD))
    assert config.gateways[0].name == "gw" and config.state_dir == "/var/lib/pdfleet/rollout"


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ("{nope", "not JSON"),
        ({**GOOD, "initial_stage": "x"}, "initial_stage: 'x' is not in stages"),
        ({**GOOD, "slo": {"ttft_p99_ms": 1.0}}, "slo: lacks itl_p99_ms, kv_transfer_p99_ms, tpot_p99_ms"),
        ({**GOOD, "gateways": [{"name": "gw", "admin_url": "http://h:1/path"}]}, "gateways[0].admin_url"),
        ({**GOOD, "colour": 1}, "colour"),
    ],
)
def test_bad_configs_name_file_and_key(tmp_path: Path, doc: object, expected: str) -> None:
    with pytest.raises(ValidationError) as err:
        load_config(_write(tmp_path, doc))
    assert expected in str(err.value) and "controller.json" in str(err.value)


def test_the_admin_key_file_must_be_private_and_not_empty(tmp_path: Path) -> None:
    key = tmp_path / "admin.key"
    key.write_text("sk-secret\n")
    key.chmod(0o600)
    assert read_admin_key(key) == "sk-secret"
    key.chmod(0o644)
    with pytest.raises(ValidationError, match="readable by group or others") as err:
        read_admin_key(key)
    assert "sk-secret" not in str(err.value)
    key.write_text("\n")
    key.chmod(0o600)
    with pytest.raises(ValidationError, match="empty"):
        read_admin_key(key)
    with pytest.raises(ValidationError, match="cannot read"):
        read_admin_key(tmp_path / "missing")

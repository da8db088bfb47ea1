"""Keys file rules (mode, schema, no secrets in errors) and authentication messages."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from pdfleet.errors import ValidationError
from pdfleet.gateway.keys import authenticate, authenticate_anthropic, hash_key, load_keys
from tests.unit.gateway.helpers import (
    ADMIN_KEY,
    COLO,
    DIS,
    USER_KEY,
    load_test_policy,
    policy_dict,
    policy_error,
    write_keys,
)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_keys_file_readable_by_others_refused(tmp_path: Path, mode: int) -> None:
    write_keys(tmp_path / "keys.yaml", mode)
    msg = policy_error(tmp_path, policy_dict(COLO, DIS))
    assert "group/world-accessible" in msg
    assert f"chmod 600 {tmp_path / 'keys.yaml'}" in msg


def test_keys_file_0400_accepted(tmp_path: Path) -> None:
    write_keys(tmp_path / "keys.yaml", 0o400)
    assert len(load_test_policy(tmp_path).keys) == 2


def test_keys_file_schema_errors(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(yaml.safe_dump({"keys": [{"name": "a", "sha256": "not-hex", "root": True}]}))
    os.chmod(path, 0o600)
    with pytest.raises(ValidationError) as exc:
        load_keys(path)
    msg = str(exc.value)
    assert f"{path}: keys[0].sha256: must match ^[0-9a-f]{{64}}$" in msg
    assert f"{path}: keys[0].root: unknown key" in msg
    assert "not-hex" not in msg, "a keys file's values (hashes, or a key pasted by mistake) are never echoed"
    h = hash_key("k")
    path.write_text(yaml.safe_dump({"keys": [{"name": "a", "sha256": h}, {"name": "b", "sha256": h}]}))
    with pytest.raises(ValidationError, match=r"keys\[1\].sha256: the same key hash appears twice"):
        load_keys(path)


def test_keys_yaml_error_does_not_quote_content(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text("keys: [ {name: secretish-value\n")
    os.chmod(path, 0o600)
    with pytest.raises(ValidationError) as exc:
        load_keys(path)
    assert "secretish" not in str(exc.value)


def test_authenticate_messages_never_echo_the_key(tmp_path: Path) -> None:
    keys = load_test_policy(tmp_path).keys
    cases = {
        None: "missing Authorization header",
        f"Basic {USER_KEY}": "must use the Bearer scheme",
        f"Token {USER_KEY}": "must use the Bearer scheme",
        "Bearer": "no key after it",
        "Bearer ": "no key after it",
        f"Bearer  {USER_KEY}": "leading or trailing whitespace",
        f"Bearer {USER_KEY}\t": "leading or trailing whitespace",
        "Bearer sk-wrong-key-123": "not valid for this gateway",
    }
    for header, expected in cases.items():
        result = authenticate(header, keys)
        assert result.entry is None and result.error is not None
        assert expected in result.error
        assert USER_KEY not in result.error and "sk-wrong" not in result.error
    ok = authenticate(f"Bearer {USER_KEY}", keys)
    assert ok.entry is not None and ok.entry.name == "user" and not ok.entry.admin
    assert authenticate(f"bearer {ADMIN_KEY}", keys).entry.admin  # type: ignore[union-attr]


def test_anthropic_clients_send_x_api_key_or_bearer(tmp_path: Path) -> None:
    keys = load_test_policy(tmp_path).keys
    ok = authenticate_anthropic(USER_KEY, None, keys)
    assert ok.entry is not None and ok.entry.name == "user"
    assert authenticate_anthropic(None, f"Bearer {ADMIN_KEY}", keys).entry.admin  # type: ignore[union-attr]
    # x-api-key wins over Authorization, as the key an Anthropic client means
    assert authenticate_anthropic("sk-wrong", f"Bearer {USER_KEY}", keys).entry is None
    cases = {
        (None, None): "missing API key; send it as 'x-api-key: <key>'",
        ("", None): "the x-api-key header is empty",
        (f" {USER_KEY}", None): "leading or trailing whitespace",
        ("sk-wrong-key-123", None): "not valid for this gateway",
        (None, "sk-wrong-key-123"): "must use the Bearer scheme",
    }
    for (api_key, authorization), expected in cases.items():
        result = authenticate_anthropic(api_key, authorization, keys)
        assert result.entry is None and result.error is not None and expected in result.error
        assert USER_KEY not in result.error and "sk-wrong" not in result.error

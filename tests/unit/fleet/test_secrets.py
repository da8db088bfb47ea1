"""The gateway's keys on the control machine: generated once (0600 in a 0700 directory), never readable by
others, and only their hashes leave the machine."""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path

import pytest

from pdfleet.errors import ValidationError
from pdfleet.fleet.secrets import KEY_PREFIX, ensure_key_file, gateway_secrets


def test_a_missing_key_is_generated_private_and_then_reused(tmp_path: Path) -> None:
    path = tmp_path / "cfg" / "client.key"
    key = ensure_key_file(path)
    assert key.startswith(KEY_PREFIX) and len(key) > len(KEY_PREFIX) + 30
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert ensure_key_file(path) == key


def test_a_key_file_others_can_read_or_an_empty_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "k"
    path.write_text("sk-pdfleet-secret\n")
    path.chmod(0o644)
    with pytest.raises(ValidationError, match="chmod 600") as err:
        ensure_key_file(path)
    assert "sk-pdfleet-secret" not in str(err.value)
    path.write_text("")
    path.chmod(0o600)
    with pytest.raises(ValidationError, match="empty"):
        ensure_key_file(path)


def test_only_hashes_are_returned(tmp_path: Path) -> None:
    client, admin = tmp_path / "c", tmp_path / "a"
    found = gateway_secrets(str(client), str(admin))
    assert found.client_sha256 == hashlib.sha256(client.read_text().strip().encode()).hexdigest()
    assert found.admin_sha256 != found.client_sha256

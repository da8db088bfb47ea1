"""Named client keys on the control machine: add, rotate (a grace period), revoke, the registry and key
files (0600, never a key in them but NAME.key), and what reaches the gateways' keys file."""

from __future__ import annotations

import dataclasses
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from pdfleet.errors import ValidationError
from pdfleet.fleet import named_keys as nk
from pdfleet.fleet.provision import render_fleet
from pdfleet.fleet.secrets import gateway_secrets
from pdfleet.gateway.keys import hash_key, load_keys
from pdfleet.model.limits import KeyLimits
from tests.unit.fleet.helpers import REPO, TEST_SECRETS, deploy

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
A, B = "1" * 64, "2" * 64


def test_add_rotate_revoke_decide_the_entries() -> None:
    limits = KeyLimits(models=["llama"], concurrent_streams=2)
    one = nk.added((), "team-a", A, NOW, limits)
    assert [(e.name, e.sha256, e.created, e.expires, e.limits) for e in one] == [
        ("team-a", A, NOW, None, limits)
    ]
    with pytest.raises(ValidationError, match="a key named 'team-a' exists; rotate it"):
        nk.added(one, "team-a", B, NOW)
    two = nk.rotated(one, "team-a", B, NOW, timedelta(hours=1))
    assert [(e.sha256, e.expires, e.limits) for e in two] == [
        (A, NOW + timedelta(hours=1), limits),
        (B, None, limits),
    ]
    assert [nk.status(e, nk.current(two, e.name) is e, NOW) for e in two] == [
        "grace until 2026-12-02T13:00:00+00:00",
        "active",
    ]
    later = NOW + timedelta(hours=2)
    assert nk.live(two, later) == two[1:] and nk.status(two[0], False, later) == "expired"
    three = nk.rotated(two, "team-a", "3" * 64, later, timedelta(0))  # the expired entry goes
    assert [(e.sha256, e.expires) for e in three] == [(B, later), ("3" * 64, None)]
    assert nk.revoked(three, "team-a") == ()
    with pytest.raises(ValidationError, match="no key named 'team-b'"):
        nk.revoked(three, "team-b")
    with pytest.raises(ValidationError, match="no key named 'team-b'; add it"):
        nk.rotated(three, "team-b", A, NOW, timedelta(hours=1))


@pytest.mark.parametrize("name", ["client", "admin", "controller", "Team", "-x", "a b", "x" * 65, ""])
def test_names_the_profile_uses_or_the_keys_file_cannot_hold_are_refused(name: str) -> None:
    with pytest.raises(ValidationError, match=f"key name {name!r}"):
        nk.added((), name, A, NOW)


def test_an_expiry_in_the_past_and_a_negative_grace_are_refused() -> None:
    with pytest.raises(ValidationError, match="is not in the future"):
        nk.added((), "a", A, NOW, expires=NOW)
    with pytest.raises(ValidationError, match="must not be negative"):
        nk.rotated(nk.added((), "a", A, NOW), "a", B, NOW, timedelta(seconds=-1))


def test_the_registry_and_key_files_are_private_and_read_back(tmp_path: Path) -> None:
    keys_dir = tmp_path / "cfg" / "keys"
    assert nk.read_registry(keys_dir) == ()
    path, key = nk.new_key_file(keys_dir, "team-a")
    entries = nk.rotated(
        nk.added((), "team-a", A, NOW, KeyLimits(models=["llama"])),
        "team-a",
        hash_key(key),
        NOW,
        timedelta(1),
    )
    nk.write_registry(keys_dir, entries)
    assert nk.read_registry(keys_dir) == entries
    registry = keys_dir / nk.REGISTRY
    for file in (registry, path):
        assert stat.S_IMODE(file.stat().st_mode) == 0o600
    assert stat.S_IMODE(keys_dir.stat().st_mode) == 0o700
    assert path.read_text() == key + "\n" and key not in registry.read_text()
    assert sorted(p.name for p in keys_dir.iterdir()) == ["keys.yaml", "team-a.key"]  # no temporary left
    registry.chmod(0o644)
    with pytest.raises(ValidationError, match="chmod 600"):
        nk.read_registry(keys_dir)
    registry.chmod(0o600)
    nk.remove_key_file(keys_dir, "team-a")
    assert not path.exists()


def test_the_gateways_get_the_controller_key_and_the_live_named_keys_as_hashes(tmp_path: Path) -> None:
    """provision's secrets: the controller key generated beside the others, the registry's live entries
    (an expired one left out); the rendered keys file is one the gateway loads, holding no key."""
    keys_dir = tmp_path / "keys"
    _, key = nk.new_key_file(keys_dir, "team-a")
    now = datetime.now(UTC)
    entries = nk.rotated(
        nk.added((), "team-a", A, now - timedelta(hours=2)), "team-a", hash_key(key), now, timedelta(0)
    )
    entries = nk.added(entries, "team-b", "5" * 64, now, KeyLimits(models=["llama-3.1-8b"]))
    nk.write_registry(keys_dir, entries)
    control = tmp_path / "control"
    found = gateway_secrets(
        str(control / "c.key"), str(control / "a.key"), None, None, str(control / "ctl.key"), str(keys_dir)
    )
    assert found.controller_key == (control / "ctl.key").read_text().strip()
    assert [e.sha256 for e in found.named] == [hash_key(key), "5" * 64]  # the rotated-out one has expired
    fleet = deploy("lab-cross", REPO / "inventory/lab.yml")
    secrets = dataclasses.replace(TEST_SECRETS, controller_key=found.controller_key, named=found.named)
    fleet = dataclasses.replace(fleet, gateway_secrets=secrets)
    rendered = {f.path: f for f in render_fleet(fleet, [fleet.inventory.hosts["lab-gw"]])["lab-gw"]}
    keys_file = rendered[fleet.profile.gateway.keys_file]
    assert found.controller_key not in keys_file.content and key not in keys_file.content
    local = tmp_path / "keys.yaml"
    local.write_text(keys_file.content)
    local.chmod(0o600)
    loaded = {e.name: e for e in load_keys(local).values()}
    assert {n: e.level for n, e in loaded.items()} == {
        "client": "client",
        "admin": "admin",
        "controller": "stage",
        "team-a": "client",
        "team-b": "client",
    }
    assert loaded["controller"].sha256 == hash_key(found.controller_key or "")
    assert loaded["team-b"].limits == KeyLimits(models=["llama-3.1-8b"])

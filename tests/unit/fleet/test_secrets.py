"""The gateway's keys on the control machine: generated once (0600 in a 0700 directory), never readable by
others, and only their hashes leave the machine."""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path

import pytest

from pdfleet.errors import ValidationError
from pdfleet.fleet.secrets import KEY_PREFIX, PLACEHOLDER, gateway_secrets, review_secrets


def test_a_missing_key_is_generated_private_and_then_reused(tmp_path: Path) -> None:
    path, admin = tmp_path / "cfg" / "client.key", str(tmp_path / "cfg" / "admin.key")
    first = gateway_secrets(str(path), admin)
    key = path.read_text().strip()
    assert key.startswith(KEY_PREFIX) and len(key) > len(KEY_PREFIX) + 30
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert gateway_secrets(str(path), admin) == first and path.read_text().strip() == key


def test_a_key_file_others_can_read_or_an_empty_one_is_refused(tmp_path: Path) -> None:
    path, admin = tmp_path / "k", str(tmp_path / "a")
    path.write_text("sk-pdfleet-secret\n")
    path.chmod(0o644)
    with pytest.raises(ValidationError, match="chmod 600") as err:
        gateway_secrets(str(path), admin)
    assert "sk-pdfleet-secret" not in str(err.value)
    path.write_text("")
    path.chmod(0o600)
    with pytest.raises(ValidationError, match="empty"):
        gateway_secrets(str(path), admin)


def test_only_hashes_are_returned(tmp_path: Path) -> None:
    client, admin = tmp_path / "c", tmp_path / "a"
    found = gateway_secrets(str(client), str(admin))
    assert found.client_sha256 == hashlib.sha256(client.read_text().strip().encode()).hexdigest()
    assert found.admin_sha256 != found.client_sha256


def test_a_directory_is_not_a_key_file(tmp_path: Path) -> None:
    (tmp_path / "keys").mkdir(mode=0o755)
    with pytest.raises(ValidationError) as err:
        gateway_secrets(str(tmp_path / "keys"), str(tmp_path / "a"))
    assert "is a directory, not a key file" in str(err.value) and "chmod" not in str(err.value)


def test_client_and_admin_must_be_different_files_and_keys(tmp_path: Path) -> None:
    one = tmp_path / "one.key"
    with pytest.raises(ValidationError, match="are the same file"):
        gateway_secrets(str(one), str(tmp_path / "x" / ".." / "one.key"))
    (tmp_path / "link.key").symlink_to(one)
    with pytest.raises(ValidationError, match="are the same file"):
        gateway_secrets(str(one), str(tmp_path / "link.key"))
    assert not one.exists(), "nothing generated for a refused pair"
    for path in (one, tmp_path / "two.key"):
        path.write_text("sk-pdfleet-same\n")
        path.chmod(0o600)
    with pytest.raises(ValidationError, match="hold the same key") as err:
        gateway_secrets(str(one), str(tmp_path / "two.key"))
    assert "sk-pdfleet-same" not in str(err.value)


@pytest.mark.parametrize("bad", ["directory", "open-mode", "empty"])
def test_a_bad_admin_key_file_leaves_no_client_key_behind(tmp_path: Path, bad: str) -> None:
    client, admin = tmp_path / "cfg" / "client.key", tmp_path / "admin.key"
    if bad == "directory":
        admin.mkdir()
    else:
        admin.write_text("" if bad == "empty" else "sk-pdfleet-x\n")
        admin.chmod(0o600 if bad == "empty" else 0o644)
    with pytest.raises(ValidationError, match=str(admin)):
        gateway_secrets(str(client), str(admin))
    assert not client.exists() and not client.parent.exists()


def _sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def test_review_reads_existing_keys_and_creates_none(tmp_path: Path) -> None:
    """`invoke render`'s keys: a missing file is a named placeholder, never a new file; an existing one
    is read, so the rendered hashes are the installed ones."""
    client, admin = tmp_path / "cfg" / "client.key", tmp_path / "cfg" / "admin.key"
    controller = tmp_path / "cfg" / "controller.key"
    found = review_secrets(str(client), str(admin), controller_key_file=str(controller))
    assert found.placeholders == (client, admin, controller)
    assert not client.parent.exists(), "nothing created"
    assert found.client_sha256 == _sha(PLACEHOLDER.format(which="client"))
    assert found.controller_key == PLACEHOLDER.format(which="controller")
    real = gateway_secrets(str(client), str(admin), controller_key_file=str(controller))  # generated
    again = review_secrets(str(client), str(admin), controller_key_file=str(controller))
    assert again.placeholders == ()
    assert (again.client_sha256, again.admin_sha256, again.controller_key) == (
        real.client_sha256,
        real.admin_sha256,
        real.controller_key,
    )
    assert (
        real.controller_key == controller.read_text().strip()
        and stat.S_IMODE(controller.stat().st_mode) == 0o600
    )
    admin.unlink()
    assert review_secrets(str(client), str(admin)).placeholders == (admin,)


def test_review_refuses_what_provision_refuses(tmp_path: Path) -> None:
    admin = tmp_path / "admin.key"
    admin.write_text("sk-pdfleet-x\n")
    admin.chmod(0o644)
    with pytest.raises(ValidationError, match="chmod 600"):
        review_secrets(str(tmp_path / "client.key"), str(admin))
    with pytest.raises(ValidationError, match="are the same file"):
        review_secrets(str(admin), str(tmp_path / "." / "admin.key"))


def test_outside_keys_are_read_never_generated_and_a_missing_one_is_a_placeholder_in_review(
    tmp_path: Path,
) -> None:
    client, admin, hosted = tmp_path / "c.key", tmp_path / "a.key", tmp_path / "hosted.key"
    outside = {"gpt-4o": str(hosted)}
    with pytest.raises(ValidationError) as exc:
        gateway_secrets(str(client), str(admin), outside)
    assert f"gateway.outside.gpt-4o.key_file: {hosted} does not exist" in str(exc.value)
    assert not client.exists() and not admin.exists()  # checked before anything is generated
    review = review_secrets(str(client), str(admin), outside)
    assert review.outside_keys["gpt-4o"] == PLACEHOLDER.format(which="outside-gpt-4o")
    assert hosted in review.placeholders
    assert review.unset_outside() == ["gpt-4o"]
    hosted.write_text("sk-hosted-provider-key\n")
    hosted.chmod(0o644)
    with pytest.raises(ValidationError, match="chmod 600"):
        gateway_secrets(str(client), str(admin), outside)
    hosted.chmod(0o600)
    got = gateway_secrets(str(client), str(admin), outside)
    assert got.outside_keys == {"gpt-4o": "sk-hosted-provider-key"} and got.unset_outside() == []
    assert "sk-hosted-provider-key" not in repr(got)

"""The lab's login key and the known_hosts read from each host's disk."""

from __future__ import annotations

from pathlib import Path

import paramiko

from pdfleet.lab.sshkeys import ensure_client_key, known_hosts_lines, read_host_public_keys, write_host_keys


def test_known_hosts_from_overlay_keys_are_what_paramiko_checks(tmp_path: Path) -> None:
    etc = tmp_path / "etc-ssh"
    etc.mkdir()
    write_host_keys(etc, "lab-a")
    keys = read_host_public_keys(etc)
    assert [k.split()[0] for k in keys] == ["ssh-ed25519", "ecdsa-sha2-nistp256"]
    assert oct((etc / "ssh_host_ed25519_key").stat().st_mode & 0o777) == "0o600"
    path = tmp_path / "known_hosts"
    path.write_text(known_hosts_lines([(("198.18.0.10", "lab-a"), keys)]))
    parsed = paramiko.HostKeys(str(path))
    private = paramiko.Ed25519Key.from_private_key_file(str(etc / "ssh_host_ed25519_key"))
    for name in ("198.18.0.10", "lab-a"):
        assert parsed.check(name, private)
    other = tmp_path / "other"
    other.mkdir()
    write_host_keys(other, "lab-b")
    assert read_host_public_keys(other) != keys


def test_client_key_is_private_and_stable(tmp_path: Path) -> None:
    key_file = tmp_path / "ssh" / "id_ed25519"
    pub = ensure_client_key(key_file)
    assert pub.startswith("ssh-ed25519 ") and oct(key_file.stat().st_mode & 0o777) == "0o600"
    assert ensure_client_key(key_file) == pub
    assert paramiko.Ed25519Key.from_private_key_file(str(key_file)).get_base64() == pub.split()[1]

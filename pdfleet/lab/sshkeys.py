"""SSH identities for the lab: the client key pdfleet logs in with, per-host host keys, known_hosts."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from pdfleet.lab.system import atomic_write

# sshd host key files each lab host gets (the image's sshd drop-in names exactly these)
HOST_KEY_TYPES: tuple[str, ...] = ("ed25519", "ecdsa")


def _private_openssh(key: ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )


def _public_openssh(key: ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey, comment: str) -> str:
    raw = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return f"{raw.decode()} {comment}\n"


def _new_key(kind: str) -> ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey:
    if kind == "ed25519":
        return ed25519.Ed25519PrivateKey.generate()
    return ec.generate_private_key(ec.SECP256R1())


def ensure_client_key(key_file: Path) -> str:
    """The lab's own login key (created once, 0600); returns its public line for authorized_keys."""
    pub = key_file.with_name(key_file.name + ".pub")
    if not key_file.exists() or not pub.exists():
        key = ed25519.Ed25519PrivateKey.generate()
        key_file.parent.mkdir(parents=True, exist_ok=True)
        key_file.parent.chmod(0o700)
        atomic_write(key_file, _private_openssh(key), 0o600)
        atomic_write(pub, _public_openssh(key, "pdfleet-lab"), 0o644)
    return pub.read_text()


def write_host_keys(etc_ssh: Path, hostname: str) -> None:
    """Fresh host keys for one host, written into its overlay (never shared through the image)."""
    for kind in HOST_KEY_TYPES:
        key = _new_key(kind)
        base = etc_ssh / f"ssh_host_{kind}_key"
        atomic_write(base, _private_openssh(key), 0o600)
        atomic_write(base.with_name(base.name + ".pub"), _public_openssh(key, f"root@{hostname}"), 0o644)


def read_host_public_keys(etc_ssh: Path) -> list[str]:
    """`TYPE BASE64` of each host key, read from the host's overlay on the control machine."""
    keys = []
    for kind in HOST_KEY_TYPES:
        parts = (etc_ssh / f"ssh_host_{kind}_key.pub").read_text().split()
        keys.append(f"{parts[0]} {parts[1]}")
    return keys


def known_hosts_lines(entries: Iterable[tuple[Iterable[str], list[str]]]) -> str:
    """known_hosts text: one line per (names, key) so each host is known by address and by name."""
    lines = []
    for names, keys in entries:
        pattern = ",".join(names)
        lines += [f"{pattern} {key}" for key in keys]
    return "\n".join(lines) + "\n"

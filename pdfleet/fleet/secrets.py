"""Secrets kept on the control machine: the gateway's client and admin keys.

Each key lives in its own file (mode 0600, generated on first use) so an operator can hand it to
clients; hosts only ever receive SHA-256 hashes of them.
"""

from __future__ import annotations

import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from pdfleet.errors import ValidationError
from pdfleet.gateway.keys import hash_key

KEY_PREFIX = "sk-pdfleet-"


@dataclass(frozen=True)
class GatewaySecrets:
    """What the gateway role needs of the keys: their hashes, never the keys."""

    client_sha256: str
    admin_sha256: str


def ensure_key_file(path: str | Path) -> str:
    """The key in `path`, created (0600, parent 0700) when missing; refuses a file others can read."""
    file = Path(path).expanduser()
    if file.exists():
        mode = stat.S_IMODE(file.stat().st_mode)
        if mode & 0o077:
            raise ValidationError(f"{file}: a key file must be readable by its owner only (mode {mode:04o}); "
                                  f"run `chmod 600 {file}`")
        key = file.read_text().strip()
        if not key:
            raise ValidationError(f"{file}: the key file is empty; delete it to have a new key generated")
        return key
    file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(key + "\n")
    return key


def gateway_secrets(client_key_file: str, admin_key_file: str) -> GatewaySecrets:
    """Hashes of the client and admin keys, generating either key file when it does not exist yet."""
    client = hash_key(ensure_key_file(client_key_file))
    return GatewaySecrets(client, hash_key(ensure_key_file(admin_key_file)))

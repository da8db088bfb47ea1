"""Secrets kept on the control machine: the gateway's client and admin keys, and the keys of its outside
aliases (the profile's `gateway.outside`: a hosted provider's key, which the operator puts there).

Each key lives in its own file (mode 0600, generated on first provision) so an operator can hand it to
clients; gateway hosts receive SHA-256 hashes of them, and the monitoring host (the rollout controller)
the admin key itself. Both files are checked before either is created, so a bad one leaves nothing new
behind. `invoke render`, a review command, creates neither: a missing key is a named placeholder. An
outside alias's key is never generated: provision refuses a missing one, render shows a placeholder; the
gateway hosts get it as a 0600 file (the gateway sends it to that provider only).
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pdfleet.errors import ValidationError
from pdfleet.fleet.gateway_tls import TlsMaterial, tls_material
from pdfleet.gateway.keys import hash_key
from pdfleet.model.tls import GatewayTlsSetting

KEY_PREFIX = "sk-pdfleet-"
PLACEHOLDER = KEY_PREFIX + "PLACEHOLDER-{which}-key-generated-by-provision"


@dataclass(frozen=True)
class GatewaySecrets:
    """What the gateway role needs of the keys: their hashes, never the keys; and the admin key itself for
    the rollout controller's 0600 file on the monitoring host (it calls the gateways' admin endpoints)."""

    client_sha256: str
    admin_sha256: str
    admin_key: str | None = field(default=None, repr=False, compare=False)
    placeholders: tuple[Path, ...] = ()  # key files that do not exist yet: their keys here are placeholders
    outside_keys: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)  # alias -> key
    tls: TlsMaterial | None = field(default=None, repr=False, compare=False)  # None: plain HTTP

    def unset_outside(self) -> list[str]:
        """The outside aliases whose key file does not exist yet (their keys here are placeholders)."""
        return [a for a, k in self.outside_keys.items() if k == PLACEHOLDER.format(which=f"outside-{a}")]


def existing_key(file: Path) -> str | None:
    """The key in `file`, or None when there is no such file; refuses a directory, anything but a regular
    file, a file others can read, and an empty file."""
    try:
        st = file.stat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValidationError(f"{file}: cannot read the key file: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise ValidationError(
            f"{file}: is a directory, not a key file; name a file (it is generated when missing)"
        )
    if not stat.S_ISREG(st.st_mode):
        raise ValidationError(f"{file}: is not a regular file; a key file must be a plain file")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        raise ValidationError(
            f"{file}: a key file must be readable by its owner only (mode {mode:04o}); run `chmod 600 {file}`"
        )
    try:
        key = file.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ValidationError(f"{file}: cannot read the key file: {reason}") from None
    if not key:
        raise ValidationError(f"{file}: the key file is empty; delete it to have a new key generated")
    return key


def _create_key_file(file: Path) -> str:
    """A new random key in a new file (0600, parent 0700)."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    try:
        file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise ValidationError(f"{file}: cannot create the key file: {exc.strerror or exc}") from None
    with os.fdopen(fd, "w") as fh:
        fh.write(key + "\n")
    return key


def _checked_keys(client: Path, admin: Path) -> tuple[str | None, str | None]:
    """The client and admin keys (None: no such file yet), refused unless both files are sound, distinct
    files holding distinct keys."""
    if os.path.realpath(client) == os.path.realpath(admin):
        raise ValidationError(
            f"gateway.client_key_file and gateway.admin_key_file are the same file "
            f"({client}); the admin key must differ from the client key"
        )
    client_key, admin_key = existing_key(client), existing_key(admin)
    if client_key is not None and client_key == admin_key:
        raise ValidationError(
            f"{client} and {admin} hold the same key; the admin key must differ from the "
            f"client key (delete {admin} to have a new one generated)"
        )
    return client_key, admin_key


def _outside_keys(files: Mapping[str, str], review: bool) -> tuple[dict[str, str], list[Path]]:
    """Each outside alias's key from its file; a missing file is refused (provision), or a placeholder
    listed as missing (`review`)."""
    keys: dict[str, str] = {}
    missing: list[Path] = []
    for alias, name in files.items():
        path = Path(name).expanduser()
        key = existing_key(path)
        if key is None and not review:
            raise ValidationError(
                f"gateway.outside.{alias}.key_file: {path} does not exist; put the provider's key for "
                f"{alias!r} there (one line, chmod 600)"
            )
        if key is None:
            missing.append(path)
        keys[alias] = key if key is not None else PLACEHOLDER.format(which=f"outside-{alias}")
    return keys, missing


def gateway_secrets(
    client_key_file: str,
    admin_key_file: str,
    outside: Mapping[str, str] | None = None,
    tls: GatewayTlsSetting | None = None,
) -> GatewaySecrets:
    """Hashes of the client and admin keys, and the outside aliases' keys (`outside`: alias -> key file).
    Every file is checked first (distinct files, distinct keys, each sound, every outside key there); only
    then is a missing client or admin key generated."""
    client, admin = Path(client_key_file).expanduser(), Path(admin_key_file).expanduser()
    client_key, admin_key = _checked_keys(client, admin)
    outside_keys, _ = _outside_keys(outside or {}, review=False)
    material = tls_material(tls)
    client_key = client_key if client_key is not None else _create_key_file(client)
    admin_key = admin_key if admin_key is not None else _create_key_file(admin)
    return GatewaySecrets(hash_key(client_key), hash_key(admin_key), admin_key, (), outside_keys, material)


def review_secrets(
    client_key_file: str,
    admin_key_file: str,
    outside: Mapping[str, str] | None = None,
    tls: GatewayTlsSetting | None = None,
) -> GatewaySecrets:
    """The keys as `gateway_secrets` checks them, but creating nothing: a key file that does not exist yet
    (provision would generate it, or the operator put it there) stands as a placeholder key, listed in
    `placeholders`."""
    client, admin = Path(client_key_file).expanduser(), Path(admin_key_file).expanduser()
    client_key, admin_key = _checked_keys(client, admin)
    outside_keys, outside_missing = _outside_keys(outside or {}, review=True)
    missing = tuple(path for path, key in ((client, client_key), (admin, admin_key)) if key is None)
    client_key = client_key if client_key is not None else PLACEHOLDER.format(which="client")
    admin_key = admin_key if admin_key is not None else PLACEHOLDER.format(which="admin")
    material = tls_material(tls, review=True)  # its own placeholders: provision never generates those
    return GatewaySecrets(
        hash_key(client_key),
        hash_key(admin_key),
        admin_key,
        (*missing, *outside_missing),
        outside_keys,
        material,
    )

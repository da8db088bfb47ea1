"""Secrets kept on the control machine: the gateway's client, admin and controller keys, the named client
keys of `invoke keys.*` (pdfleet.fleet.named_keys), and the keys of its outside aliases (the profile's
`gateway.outside`: a hosted provider's key, which the operator puts there).

Each key lives in its own file (mode 0600, generated on first provision) so an operator can hand it to
clients; gateway hosts receive SHA-256 hashes of them, and the monitoring host (the rollout controller)
the controller's stage-only key itself: the admin key never leaves this machine. Every file is checked
before any is created, so a bad one leaves nothing new behind. `invoke render`, a review command, creates
none: a missing key is a named placeholder. An outside alias's key is never generated: provision refuses a
missing one, render shows a placeholder; the gateway hosts get it as a 0600 file (the gateway sends it to
that provider only).
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from pdfleet.errors import ValidationError
from pdfleet.fleet.gateway_tls import TlsMaterial, tls_material
from pdfleet.fleet.named_keys import KEY_PREFIX, live, read_registry
from pdfleet.gateway.keys import KeyEntry, hash_key
from pdfleet.model.tls import GatewayTlsSetting

PLACEHOLDER = KEY_PREFIX + "PLACEHOLDER-{which}-key-generated-by-provision"


@dataclass(frozen=True)
class GatewaySecrets:
    """What the gateway role needs of the keys: their hashes, never the keys; and the controller's
    stage-only key itself for its 0600 file on the monitoring host (it sets the gateways' stage)."""

    client_sha256: str
    admin_sha256: str
    controller_key: str | None = field(default=None, repr=False, compare=False)
    placeholders: tuple[Path, ...] = ()  # key files that do not exist yet: their keys here are placeholders
    outside_keys: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)  # alias -> key
    tls: TlsMaterial | None = field(default=None, repr=False, compare=False)  # None: plain HTTP
    named: tuple[KeyEntry, ...] = ()  # the named client keys' live entries (hashes, dates, limits)

    @property
    def controller_sha256(self) -> str | None:
        """The controller key's hash, for the gateways' keys file (None: no controller key)."""
        return None if self.controller_key is None else hash_key(self.controller_key)

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


def _checked_keys(files: Mapping[str, Path]) -> dict[str, str | None]:
    """The keys by label (client, admin, controller; None: no such file yet), refused unless every file
    is sound and they are distinct files holding distinct keys."""
    labels = list(files)
    for i, a in enumerate(labels):
        for b in labels[i + 1 :]:
            if os.path.realpath(files[a]) == os.path.realpath(files[b]):
                raise ValidationError(
                    f"gateway.{a}_key_file and gateway.{b}_key_file are the same file ({files[a]}); "
                    f"the {b} key must differ from the {a} key"
                )
    keys = {label: existing_key(path) for label, path in files.items()}
    for i, a in enumerate(labels):
        for b in labels[i + 1 :]:
            if keys[a] is not None and keys[a] == keys[b]:
                raise ValidationError(
                    f"{files[a]} and {files[b]} hold the same key; the {b} key must differ from the "
                    f"{a} key (delete {files[b]} to have a new one generated)"
                )
    return keys


def _key_files(client: str, admin: str, controller: str | None) -> dict[str, Path]:
    """The profile's key files by label (the controller's only when given)."""
    named = {"client": client, "admin": admin, **({"controller": controller} if controller else {})}
    return {label: Path(name).expanduser() for label, name in named.items()}


def _named(keys_dir: str | None) -> tuple[KeyEntry, ...]:
    """The named keys' live entries from the registry in `keys_dir` (none without one)."""
    if keys_dir is None:
        return ()
    return live(read_registry(Path(keys_dir).expanduser()), datetime.now(UTC))


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
    controller_key_file: str | None = None,
    keys_dir: str | None = None,
) -> GatewaySecrets:
    """Hashes of the client and admin keys, the controller's key, the named keys' live entries, and the
    outside aliases' keys (`outside`: alias -> key file). Every file is checked first (distinct files,
    distinct keys, each sound, every outside key there); only then is a missing client, admin or
    controller key generated."""
    files = _key_files(client_key_file, admin_key_file, controller_key_file)
    keys = _checked_keys(files)
    outside_keys, _ = _outside_keys(outside or {}, review=False)
    material = tls_material(tls)
    named = _named(keys_dir)
    made = {label: key if key is not None else _create_key_file(files[label]) for label, key in keys.items()}
    return GatewaySecrets(
        hash_key(made["client"]),
        hash_key(made["admin"]),
        made.get("controller"),
        (),
        outside_keys,
        material,
        named,
    )


def review_secrets(
    client_key_file: str,
    admin_key_file: str,
    outside: Mapping[str, str] | None = None,
    tls: GatewayTlsSetting | None = None,
    controller_key_file: str | None = None,
    keys_dir: str | None = None,
) -> GatewaySecrets:
    """The keys as `gateway_secrets` checks them, but creating nothing: a key file that does not exist yet
    (provision would generate it, or the operator put it there) stands as a placeholder key, listed in
    `placeholders`."""
    files = _key_files(client_key_file, admin_key_file, controller_key_file)
    keys = _checked_keys(files)
    outside_keys, outside_missing = _outside_keys(outside or {}, review=True)
    missing = tuple(files[label] for label, key in keys.items() if key is None)
    made = {label: key if key is not None else PLACEHOLDER.format(which=label) for label, key in keys.items()}
    material = tls_material(tls, review=True)  # its own placeholders: provision never generates those
    return GatewaySecrets(
        hash_key(made["client"]),
        hash_key(made["admin"]),
        made.get("controller"),
        (*missing, *outside_missing),
        outside_keys,
        material,
        _named(keys_dir),
    )

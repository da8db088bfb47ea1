"""Named client keys on the control machine (issue 28; `invoke keys.*`): their registry and key files.

`gateway.keys_dir` (0700) holds `keys.yaml` (0600), the registry: each named key's entry as the gateway's
keys file takes it (pdfleet.gateway.keys.KeyEntry: name, SHA-256, created, expires, limits), and one
`NAME.key` (0600) per key, its plaintext, for the operator to hand to that client. Only the entries reach
the gateways (roles/gateway writes them into the keys file beside the client, admin and controller keys;
a reload applies them, no restart). A rotation writes a new key to NAME.key and keeps the old hash with
`expires` set a grace period ahead: both keys work until then, and the gateway refuses the old one by
itself afterwards (streams opened with it finish). Expired entries are left out of what hosts get.

The functions deciding the new entries are pure (`added`, `rotated`, `revoked`, `live`); reading and
writing the files is separate, and no message carries a key.
"""

from __future__ import annotations

import os
import re
import secrets
import tempfile
from datetime import datetime, timedelta
from pathlib import Path

from pydantic import BaseModel, ConfigDict
from pydantic import ValidationError as PydanticValidationError

from pdfleet.errors import ValidationError
from pdfleet.gateway.keys import KeyEntry, check_key_file_mode, read_secret_file
from pdfleet.model.limits import KeyLimits
from pdfleet.model.schema_errors import schema_problems
from pdfleet.model.yamlfile import parse_yaml

REGISTRY = "keys.yaml"
KEY_PREFIX = "sk-pdfleet-"
NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
RESERVED = ("client", "admin", "controller")  # the profile's own keys carry these names


class Registry(BaseModel):
    """The registry file: `keys:` the named keys' entries (empty before the first `keys.add`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    keys: list[KeyEntry] = []


# ---- deciding (pure) ---------------------------------------------------------------------------------


def check_name(name: str) -> None:
    """Refuse a name the gateway's keys file could not hold or that the profile's keys use."""
    if not NAME.fullmatch(name):
        raise ValidationError(
            f"key name {name!r}: use 1-64 characters of a-z, 0-9, '_', '.', '-', starting with a letter "
            "or digit"
        )
    if name in RESERVED:
        raise ValidationError(f"key name {name!r} is the profile's own key; choose another name")


def current(entries: tuple[KeyEntry, ...], name: str) -> KeyEntry | None:
    """The newest entry of `name` (the key its NAME.key holds), or None."""
    found = [e for e in entries if e.name == name]
    return found[-1] if found else None


def added(
    entries: tuple[KeyEntry, ...],
    name: str,
    digest: str,
    now: datetime,
    limits: KeyLimits | None = None,
    expires: datetime | None = None,
) -> tuple[KeyEntry, ...]:
    """The registry with a new key `name` (refused when the name is taken, expired entries included)."""
    check_name(name)
    if current(entries, name) is not None:
        raise ValidationError(f"a key named {name!r} exists; rotate it (keys.rotate) or revoke it first")
    if expires is not None and expires <= now:
        raise ValidationError(f"the expiry {expires.isoformat()} is not in the future")
    entry = KeyEntry(name=name, sha256=digest, created=now, expires=expires, limits=limits)
    return (*entries, entry)


def rotated(
    entries: tuple[KeyEntry, ...], name: str, digest: str, now: datetime, grace: timedelta
) -> tuple[KeyEntry, ...]:
    """The registry with a new key for `name` (same limits and expiry as its current one) and each older
    entry of it ending `grace` from now at the latest."""
    old = current(entries, name)
    if old is None:
        raise ValidationError(f"no key named {name!r}; add it with keys.add")
    if grace < timedelta(0):
        raise ValidationError(f"the grace period must not be negative (got {grace})")
    ends = now + grace
    kept = tuple(
        e.model_copy(update={"expires": ends if e.expires is None else min(e.expires, ends)})
        if e.name == name
        else e
        for e in live(entries, now)
    )
    new = KeyEntry(name=name, sha256=digest, created=now, expires=old.expires, limits=old.limits)
    return (*kept, new)


def revoked(entries: tuple[KeyEntry, ...], name: str) -> tuple[KeyEntry, ...]:
    """The registry without any entry of `name` (refused when there is none)."""
    if current(entries, name) is None:
        raise ValidationError(f"no key named {name!r} (keys.list shows the names)")
    return tuple(e for e in entries if e.name != name)


def live(entries: tuple[KeyEntry, ...], now: datetime) -> tuple[KeyEntry, ...]:
    """The entries not expired at `now`: what the gateways get."""
    return tuple(e for e in entries if not e.expired(now))


def status(entry: KeyEntry, newest: bool, now: datetime) -> str:
    """How keys.list shows an entry: active, in its grace period until a time, or expired."""
    if entry.expired(now):
        return "expired"
    if not newest and entry.expires is not None:
        return f"grace until {entry.expires.isoformat(timespec='seconds')}"
    return "active"


# ---- the files ------------------------------------------------------------------------------------------


def read_registry(keys_dir: Path) -> tuple[KeyEntry, ...]:
    """The registry's entries (none when it does not exist yet); a readable-by-others file is refused."""
    path = keys_dir / REGISTRY
    if not path.exists():
        return ()
    check_key_file_mode(path)
    data = parse_yaml(read_secret_file(path), path, secret=True)
    try:
        registry = Registry.model_validate(data)
    except PydanticValidationError as exc:
        raise ValidationError("\n".join(schema_problems(exc, Registry, path, show_values=False))) from None
    return tuple(registry.keys)


def registry_text(entries: tuple[KeyEntry, ...]) -> str:
    """The registry file's text: one JSON-style line per entry (YAML flow), never a key."""
    lines = [
        "# Managed by `invoke keys.*`: named client keys' hashes (their keys are the NAME.key files).",
        "keys:",
    ]
    lines += [f"  - {entry.model_dump_json(exclude_defaults=True)}" for entry in entries]
    return "\n".join(lines) + ("\n" if entries else " []\n")


def write_registry(keys_dir: Path, entries: tuple[KeyEntry, ...]) -> None:
    """Replace the registry (0600, in a 0700 directory) atomically."""
    _write_private(keys_dir / REGISTRY, registry_text(entries))


def new_key_file(keys_dir: Path, name: str) -> tuple[Path, str]:
    """A new random key for `name` in NAME.key (0600, replacing an older one atomically): its path and
    the key, which the caller hashes and never prints."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    path = keys_dir / f"{name}.key"
    _write_private(path, key + "\n")
    return path, key


def remove_key_file(keys_dir: Path, name: str) -> None:
    """Delete NAME.key (a revoked key's), if it is there."""
    (keys_dir / f"{name}.key").unlink(missing_ok=True)


def _write_private(path: Path, text: str) -> None:
    """Write `text` to `path` through a 0600 temporary file in the same 0700 directory, then rename."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except OSError as exc:
        raise ValidationError(f"{path}: cannot write: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise

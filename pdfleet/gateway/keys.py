"""Client API keys: the keys file (SHA-256 hashes only, mode 0600) and the Authorization header check.

Keys are never stored, logged or echoed; only their SHA-256 hex digests are kept, and a request's
key is hashed and looked up. Error messages say what is wrong without repeating the key.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field
from pydantic import ValidationError as PydanticValidationError

from pdfleet.errors import ValidationError
from pdfleet.model.schema_errors import schema_problems
from pdfleet.model.yamlfile import parse_yaml

_HEX64 = r"^[0-9a-f]{64}$"


class KeyEntry(BaseModel):
    """One client key: a name for logs and metrics, its SHA-256 hex digest, admin rights."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=64)
    sha256: str = Field(pattern=_HEX64)
    admin: bool = False


class KeysFile(BaseModel):
    """The keys file: `keys:` list of entries."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    keys: list[KeyEntry] = Field(min_length=1)


def hash_key(key: str) -> str:
    """SHA-256 hex digest of a key, the only form in which keys are stored."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def check_key_file_mode(path: Path) -> None:
    """Refuse a keys file that group or others can read or write (it must be 0600 or stricter)."""
    check_secret_file_mode(path, "the keys file")


def check_secret_file_mode(path: Path, what: str, where: str = "") -> None:
    """Refuse a secret-holding file (`what`) that is not a regular file readable by its owner only;
    `where` (the policy key naming it) heads the message when given."""
    head = f"{where}: {path}" if where else str(path)
    try:
        st = path.stat()
    except OSError as exc:
        raise ValidationError(f"{head}: cannot read {what}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ValidationError(f"{head}: {what} is not a regular file")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        raise ValidationError(
            f"{head}: {what} is group/world-accessible (mode {mode:04o}); it must be readable by "
            f"its owner only: run `chmod 600 {path}`. Refusing to use it."
        )


def read_secret_file(path: Path, where: str = "") -> bytes:
    """A secret file's bytes, never through a symlink at the file; errors name the file, not its content."""
    head = f"{where}: {path}" if where else str(path)
    try:
        with open(path, "rb", opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW)) as fh:
            return fh.read()
    except OSError as exc:
        raise ValidationError(f"{head}: cannot read the file: {exc.strerror}") from None


def load_keys(path: Path) -> dict[str, KeyEntry]:
    """Keys by SHA-256 digest from a 0600 YAML keys file; errors name the file and key path."""
    check_key_file_mode(path)
    try:
        with open(path, "rb", opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW)) as fh:
            raw = fh.read()
    except OSError as exc:
        raise ValidationError(f"{path}: cannot read the keys file: {exc.strerror}") from None
    # secret: the parser's message could quote file content, and this file holds secrets' hashes
    data = parse_yaml(raw, path, secret=True)
    try:
        parsed = KeysFile.model_validate(data)
    except PydanticValidationError as exc:
        raise ValidationError("\n".join(schema_problems(exc, KeysFile, path, show_values=False))) from None
    keys: dict[str, KeyEntry] = {}
    names: set[str] = set()
    for i, entry in enumerate(parsed.keys):
        if entry.sha256 in keys:
            raise ValidationError(f"{path}: keys[{i}].sha256: the same key hash appears twice")
        if entry.name in names:
            raise ValidationError(f"{path}: keys[{i}].name: {entry.name!r} is used twice")
        keys[entry.sha256] = entry
        names.add(entry.name)
    return keys


@dataclass(frozen=True)
class AuthResult:
    """Either the matching key entry (and its digest) or a message saying what is wrong."""

    entry: KeyEntry | None
    digest: str | None
    error: str | None


def authenticate(header: str | None, keys: Mapping[str, KeyEntry]) -> AuthResult:
    """Check an Authorization header against the keys; the message never contains the key."""
    if header is None:
        return AuthResult(None, None, "missing Authorization header; send 'Authorization: Bearer <key>'")
    scheme, sep, key = header.partition(" ")
    if scheme.lower() != "bearer":
        return AuthResult(
            None, None, "the Authorization header must use the Bearer scheme: 'Authorization: Bearer <key>'"
        )
    if not sep or not key.strip():
        return AuthResult(None, None, "the Authorization header has the Bearer scheme but no key after it")
    if key != key.strip():
        return AuthResult(
            None, None, "the API key has leading or trailing whitespace; send exactly 'Bearer <key>'"
        )
    return _lookup(key, keys)


def authenticate_anthropic(
    api_key: str | None, authorization: str | None, keys: Mapping[str, KeyEntry]
) -> AuthResult:
    """Check an Anthropic client's key: `x-api-key` (ANTHROPIC_API_KEY), else `Authorization: Bearer`
    (ANTHROPIC_AUTH_TOKEN); the message never contains the key."""
    if api_key is None:
        if authorization is None:
            return AuthResult(
                None,
                None,
                "missing API key; send it as 'x-api-key: <key>' (ANTHROPIC_API_KEY) or "
                "'Authorization: Bearer <key>' (ANTHROPIC_AUTH_TOKEN)",
            )
        return authenticate(authorization, keys)
    if not api_key.strip():
        return AuthResult(None, None, "the x-api-key header is empty")
    if api_key != api_key.strip():
        return AuthResult(
            None, None, "the x-api-key header has leading or trailing whitespace around the key"
        )
    return _lookup(api_key, keys)


def _lookup(key: str, keys: Mapping[str, KeyEntry]) -> AuthResult:
    """The entry of a well-formed key, or 'not valid'."""
    digest = hash_key(key)
    entry = keys.get(digest)
    if entry is None:
        return AuthResult(None, None, "the API key is not valid for this gateway")
    return AuthResult(entry, digest, None)

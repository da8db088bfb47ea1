"""API keys: the keys file (SHA-256 hashes only, mode 0600) and the Authorization header check.

Keys are never stored, logged or echoed; only their SHA-256 hex digests are kept, and a request's
key is hashed and looked up. Error messages say what is wrong without repeating the key.

Each entry has a name and a scope (issue 28): `client` keys call the model endpoints, a `stage` key (the
rollout controller's) may only read the policy, set the stage and run a plan's shadow step, an `admin`
key may do everything
(`admin: true` is the same as `scope: admin`). A client key may carry its own `limits` (its models and
rates, as the policy's `limits.keys.<name>` would) and an `expires` time: past it the gateway refuses the
key by itself, so a rotation keeps the old key for a grace period and needs no second reload to end it.
One name may appear more than once only while a rotation's grace runs: every entry of it but one expires.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator
from pydantic import ValidationError as PydanticValidationError

from pdfleet.errors import ValidationError
from pdfleet.model.limits import KeyLimits
from pdfleet.model.schema_errors import schema_problems
from pdfleet.model.yamlfile import parse_yaml

_HEX64 = r"^[0-9a-f]{64}$"
Scope = Literal["client", "stage", "admin"]
# what each kind of endpoint needs: the model endpoints a client key (an admin key may call them too), the
# rollout's (read the policy, set the stage, a plan's shadow step) the stage key or an admin one,
# everything else (reload, keys) an admin key
ALLOWED: dict[Scope, frozenset[Scope]] = {
    "client": frozenset({"client", "admin"}),
    "stage": frozenset({"stage", "admin"}),
    "admin": frozenset({"admin"}),
}
NEEDS = {
    "client": "a client key",
    "stage": "the controller's stage key or an admin key",
    "admin": "an admin key",
}


class KeyEntry(BaseModel):
    """One key: a name for logs and metrics, its SHA-256 hex digest, its scope; a client key's own limits
    and when it was created and expires (both optional)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=64)
    sha256: str = Field(pattern=_HEX64)
    admin: bool = False  # the older spelling of `scope: admin`
    scope: Scope = "client"
    created: AwareDatetime | None = None
    expires: AwareDatetime | None = None
    limits: KeyLimits | None = None

    @model_validator(mode="after")
    def _one_scope(self) -> KeyEntry:
        if self.admin and self.scope not in ("client", "admin"):
            raise ValueError(f"admin: true contradicts scope: {self.scope}; keep one of them")
        if self.limits is not None and self.level != "client":
            raise ValueError("limits: only a client key carries its own limits")
        return self

    @property
    def level(self) -> Scope:
        """The key's scope (`admin: true` reads as admin)."""
        return "admin" if self.admin else self.scope

    def expired(self, now: datetime) -> bool:
        """Whether the key is past its `expires`."""
        return self.expires is not None and now >= self.expires

    def public(self, last_used: float | None) -> dict[str, object]:
        """What /admin/keys shows of the entry: never its hash."""
        return {
            "name": self.name,
            "scope": self.level,
            "created": None if self.created is None else self.created.isoformat(),
            "expires": None if self.expires is None else self.expires.isoformat(),
            "models": None if self.limits is None else self.limits.models,
            "last_used": last_used,
        }


def keys_document(keys: Mapping[str, KeyEntry], last_used: Mapping[str, float]) -> dict[str, object]:
    """What /admin/keys shows: every entry's name, scope, dates, models and when its name was last used
    (epoch seconds, since the gateway started), and whether it has expired; never a key or a hash."""
    now = datetime.now(UTC)
    return {"keys": [{**k.public(last_used.get(k.name)), "expired": k.expired(now)} for k in keys.values()]}


def refusal(entry: KeyEntry, need: Scope) -> str | None:
    """Why this key may not call an endpoint that needs `need`, or None (names the key, never shows it)."""
    if entry.level in ALLOWED[need]:
        return None
    return f"the key {entry.name!r} (scope {entry.level}) may not call this endpoint; it needs {NEEDS[need]}"


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
    for i, entry in enumerate(parsed.keys):
        if entry.sha256 in keys:
            raise ValidationError(f"{path}: keys[{i}].sha256: the same key hash appears twice")
        problem = _name_problem(entry, [k for k in keys.values() if k.name == entry.name])
        if problem:
            raise ValidationError(f"{path}: keys[{i}].name: {entry.name!r} {problem}")
        keys[entry.sha256] = entry
    return keys


def _name_problem(entry: KeyEntry, same: list[KeyEntry]) -> str | None:
    """Why `entry` may not share its name with the earlier entries `same`, or None: a name repeats only
    for a rotation (same scope and limits, at most one entry without `expires`)."""
    if not same:
        return None
    if any(k.level != entry.level or k.limits != entry.limits for k in same):
        return "is used twice with different scopes or limits (a rotation keeps both the same)"
    if sum(k.expires is None for k in (*same, entry)) > 1:
        return "is used twice; only a rotation repeats a name, and every entry of it but one has expires"
    return None


def entry_limits(keys: Mapping[str, KeyEntry]) -> dict[str, KeyLimits]:
    """The limits client keys carry in the keys file, by name."""
    return {k.name: k.limits for k in keys.values() if k.limits is not None}


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
    """The entry of a well-formed key, or 'not valid' (an expired key too: a rotated-out key is gone)."""
    digest = hash_key(key)
    entry = keys.get(digest)
    if entry is None or entry.expired(datetime.now(UTC)):
        return AuthResult(None, None, "the API key is not valid for this gateway")
    return AuthResult(entry, digest, None)

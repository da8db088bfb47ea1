"""Outside endpoints: an alias served by a hosted OpenAI- or Anthropic-compatible API instead of a pool.

In the policy an outside alias reads
`models.<alias>: {outside: {api: openai|anthropic, base_url: URL, key_file: PATH}, upstream_model: NAME}`.
The gateway reads the key file at load (0600 or stricter, refused otherwise), holds the key in memory
only, and sends it in the header that API expects (`Authorization: Bearer` for OpenAI, `x-api-key` for
Anthropic); the client's own pdfleet key is never forwarded. The key never reaches a log line, an error,
a metric, /admin output or a client: nothing here formats it, and the objects holding it do not print it.
An outside alias has no pools, no P/D and no stage: every request goes to the one endpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import Field
from yarl import URL

from pdfleet.errors import ValidationError
from pdfleet.gateway.keys import check_secret_file_mode, read_secret_file
from pdfleet.model.outside import Api, OutsideEndpoint

# the client endpoints each kind of outside API serves (the gateway does not translate between APIs)
API_ENDPOINTS: dict[str, tuple[str, ...]] = {"openai": ("chat", "completions"), "anthropic": ("messages",)}
_API_NAMES = {"openai": "the OpenAI API", "anthropic": "the Anthropic Messages API"}
_ENDPOINT_PATHS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "messages": "/v1/messages",
}
ANTHROPIC_VERSION = "2023-06-01"  # sent when the client names none (Anthropic's API requires the header)
MAX_KEY_BYTES = 4096


class OutsideSpec(OutsideEndpoint):
    """Where an outside alias goes: which API it speaks, its base URL, the file holding its key."""

    key_file: str = Field(min_length=1)


@dataclass(frozen=True)
class Outside:
    """A loaded outside endpoint: the spec's facts and the key (kept out of repr and comparisons)."""

    api: Api
    base_url: str  # origin plus an optional path prefix, no trailing slash
    key_file: str
    key: str = field(repr=False, compare=False)

    @property
    def prefix(self) -> str:
        """The base URL's path, prepended to /v1/... (empty for a bare origin)."""
        return URL(self.base_url).path.rstrip("/")

    def path(self, endpoint: str) -> str:
        """The request path for a client endpoint (chat, completions, messages)."""
        return self.prefix + _ENDPOINT_PATHS[endpoint]

    def summary(self) -> dict[str, str]:
        """What /admin/policy shows: never the key, only where it comes from."""
        return {"api": self.api, "base_url": self.base_url, "key_file": self.key_file}


def read_outside_key(path: Path, where: str) -> str:
    """The key in a 0600 key file (one line); ValidationError naming `where` and the file, never the key."""
    check_secret_file_mode(path, "the outside endpoint's key file", where)
    raw = read_secret_file(path, where)
    if len(raw) > MAX_KEY_BYTES:
        raise ValidationError(f"{where}: {path}: the key file is over {MAX_KEY_BYTES} bytes (one key)")
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise ValidationError(f"{where}: {path}: the key file is not ASCII text") from None
    key = text.strip()
    if not key:
        raise ValidationError(f"{where}: {path}: the key file is empty")
    if not all(33 <= ord(c) < 127 for c in key):
        raise ValidationError(
            f"{where}: {path}: the key file must hold one key on one line (no spaces or control characters)"
        )
    return key


def load_outside(spec: OutsideSpec, base_dir: Path, where: str) -> Outside:
    """Read an outside alias's key file (a relative path is under the policy file's directory)."""
    path = Path(spec.key_file)
    if not path.is_absolute():
        path = base_dir / path
    return Outside(spec.api, spec.base_url, spec.key_file, read_outside_key(path, where))


def check_api(alias: str, outside: Outside | None, endpoint: str) -> str | None:
    """Why `endpoint` cannot reach `alias` (an outside alias speaks one API; nothing is translated)."""
    if outside is None or endpoint in API_ENDPOINTS[outside.api]:
        return None
    paths = " or ".join(_ENDPOINT_PATHS[e] for e in API_ENDPOINTS[outside.api])
    return (
        f"model {alias!r} is an outside endpoint speaking {_API_NAMES[outside.api]}; call it at {paths}, "
        f"not {_ENDPOINT_PATHS[endpoint]} (the gateway does not translate between APIs)"
    )


def outside_headers(outside: Outside, client: Mapping[str, str]) -> dict[str, str]:
    """The headers sent to an outside endpoint: its own key in its API's header, the client's key never."""
    headers = {"Content-Type": "application/json", "Accept": client.get("Accept", "*/*")}
    if outside.api == "anthropic":
        headers["x-api-key"] = outside.key
        headers["anthropic-version"] = client.get("anthropic-version", ANTHROPIC_VERSION)
        beta = client.get("anthropic-beta")
        if beta:
            headers["anthropic-beta"] = beta
    else:
        headers["Authorization"] = f"Bearer {outside.key}"
    return headers

"""Outside endpoints: aliases served by a hosted OpenAI- or Anthropic-compatible API, not by a pool.

One definition of such an endpoint (which API, its base URL) for both files that name one: the gateway's
policy (`models.<alias>.outside`, with the key file on the gateway host; `pdfleet.gateway.outside`) and the
profile's `gateway.outside` (with the key file on the control machine, which provision copies to the
gateway hosts, 0600).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from yarl import URL

Api = Literal["openai", "anthropic"]
# an alias provision renders from the profile names a key file after it: one path segment, no surprises
ALIAS_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$"


def outside_url(value: str) -> str:
    """An http(s) URL with a host and an optional path prefix (the gateway appends /v1/...)."""
    url = URL(value)
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(f"{value!r} is not an http(s) URL with a host (e.g. https://api.example.com)")
    if url.query_string or url.fragment or url.user or url.password:
        raise ValueError(f"{value!r} has a query, fragment or user part; give scheme, host and path only")
    if url.path.rstrip("/").endswith("/v1"):
        raise ValueError(f"{value!r} ends with /v1; give the URL before it, the gateway appends /v1/...")
    return str(url.with_query(None)).rstrip("/")


OutsideUrl = Annotated[str, AfterValidator(outside_url)]


class OutsideEndpoint(BaseModel):
    """Which API an outside endpoint speaks and where it is."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    api: Api
    base_url: OutsideUrl


class OutsideAlias(OutsideEndpoint):
    """A profile's outside alias: the endpoint, the model name it knows, and the file on the control
    machine holding its key (0600; provision copies it to each gateway host, never on a command line)."""

    upstream_model: str = Field(min_length=1)
    key_file: str = Field(min_length=1)

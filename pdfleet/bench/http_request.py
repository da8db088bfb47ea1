"""The raw HTTP/1.1 request the benchmarks' streaming client (pdfleet.bench.client) sends: built once per
request as bytes, so that the client's loop only writes them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def request_bytes(
    host: str,
    port: int,
    path: str,
    body: bytes | Mapping[str, Any],
    *,
    key: str | None = None,
    pool: str | None = None,
    headers: Mapping[str, str] | None = None,
    keepalive: bool = True,
) -> bytes:
    """A raw HTTP/1.1 POST of `body` (JSON-encoded unless bytes): `key` as a bearer token, `pool` in
    X-Pdfleet-Pool for the gateway, `headers` (a session id, say) after them; `Connection: close`
    unless kept alive. A header that would not be one line is refused (ValueError)."""
    extra = dict(headers or {})
    for name, value in extra.items():
        if any(c in name + value for c in "\r\n\0") or not name or ":" in name:
            raise ValueError(f"header {name!r}: not one header line")
    payload = body if isinstance(body, bytes) else json.dumps(body).encode()
    head = [
        f"POST {path} HTTP/1.1",
        f"Host: {host}:{port}",
        "Content-Type: application/json",
        "Accept: text/event-stream",
        f"Content-Length: {len(payload)}",
    ]
    if key:
        head.append(f"Authorization: Bearer {key}")
    if pool:
        head.append(f"X-Pdfleet-Pool: {pool}")
    if not keepalive:
        head.append("Connection: close")  # HTTP/1.1 keeps alive by default
    head += [f"{name}: {value}" for name, value in extra.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + payload

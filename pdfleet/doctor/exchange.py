"""One HTTP exchange as a client made it, recorded with every key masked: the evidence of client findings.

`Recorder` hooks into the httpx2 client the OpenAI and Anthropic SDKs are given, so what is recorded is
exactly what the SDK sent and what came back (or how the connection failed).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx2

from pdfleet.doctor.finding import mask_text

BODY_LIMIT = 1500  # characters of a body kept as evidence
# Request headers worth showing (the rest are the SDK's user agent and retry bookkeeping).
REQUEST_HEADERS = ("authorization", "x-api-key", "anthropic-version", "content-type")
RESPONSE_HEADERS = ("content-type", "x-pdfleet-pool", "x-request-id", "server", "www-authenticate")


@dataclass(frozen=True)
class Exchange:
    """A request and its answer (`status` None: no answer, `error` says why), keys masked."""

    probe: str
    method: str
    url: str
    request_headers: tuple[tuple[str, str], ...] = ()
    request_body: str = ""
    status: int | None = None
    response_headers: tuple[tuple[str, str], ...] = ()
    response_body: str = ""
    error: str | None = None  # connection-level failure: refused, unreachable, timeout, bad header
    outcome: str = ""  # what the SDK (or the script's code) made of the answer

    def header(self, name: str) -> str | None:
        """A response header's value (case-insensitive), None when absent."""
        return next((v for k, v in self.response_headers if k.lower() == name.lower()), None)

    def body_json(self) -> Any:
        """The response body as JSON, None when it is not JSON."""
        try:
            return json.loads(self.response_body)
        except ValueError:
            return None

    @property
    def is_sse(self) -> bool:
        """The answer is a server-sent event stream."""
        return (self.header("content-type") or "").startswith("text/event-stream")

    def error_message(self) -> str:
        """The error message of an OpenAI, Anthropic or vLLM error body ('' when there is none)."""
        body = self.body_json()
        if isinstance(body, dict):
            err = body.get("error")
            if isinstance(err, dict):
                return str(err.get("message") or "")
            if isinstance(err, str):
                return err
        return ""

    def error_type(self) -> str:
        """`error.type` of an error body (authentication_error, invalid_request_error)."""
        body = self.body_json()
        err = body.get("error") if isinstance(body, dict) else None
        return str(err.get("type") or "") if isinstance(err, dict) else ""

    def error_code(self) -> str:
        """`error.code` of an OpenAI error body (the gateway's invalid_api_key, model_not_found)."""
        body = self.body_json()
        err = body.get("error") if isinstance(body, dict) else None
        return str(err.get("code") or "") if isinstance(err, dict) else ""

    def evidence(self) -> str:
        """The exchange as a reader wants to see it: request line, key headers, status, body excerpt."""
        lines = [f"{self.method} {self.url}"]
        lines += [f"  {k}: {v}" for k, v in self.request_headers]
        if self.request_body:
            lines.append(f"  {self.request_body[:300]}")
        if self.error is not None:
            lines.append(f"→ no answer: {self.error}")
        else:
            lines.append(f"→ {self.status}" + "".join(f"  {k}: {v}" for k, v in self.response_headers))
            if self.response_body:
                lines.append(f"  {self.response_body[:400]}")
        if self.outcome:
            lines.append(f"client: {self.outcome}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """The exchange as JSON (keys already masked)."""
        return {
            "probe": self.probe,
            "method": self.method,
            "url": self.url,
            "request_headers": dict(self.request_headers),
            "status": self.status,
            "response_headers": dict(self.response_headers),
            "response_body": self.response_body,
            "error": self.error,
            "outcome": self.outcome,
        }


@dataclass
class Recorder:
    """httpx2 event hooks that record every exchange of one probe, masking `secrets` everywhere."""

    secrets: tuple[str, ...]
    probe: str = ""
    exchanges: list[Exchange] = field(default_factory=list)
    _pending: dict[int, Exchange] = field(default_factory=dict)

    def hooks(self) -> dict[str, list[Any]]:
        """The event_hooks mapping for httpx2.Client."""
        return {"request": [self._request], "response": [self._response]}

    def mask(self, text: str) -> str:
        """Text with every secret masked."""
        return mask_text(text, self.secrets)

    def _request(self, request: httpx2.Request) -> None:
        headers = tuple((k, self.mask(v)) for k, v in request.headers.items() if k.lower() in REQUEST_HEADERS)
        body = request.content.decode("utf-8", "replace") if request.content else ""
        ex = Exchange(
            self.probe, request.method, self.mask(str(request.url)), headers, self.mask(body[:BODY_LIMIT])
        )
        self._pending[id(request)] = ex
        self.exchanges.append(ex)

    def _response(self, response: httpx2.Response) -> None:
        response.read()  # bounded by the probes' tiny max_tokens; the SDK then reads the buffered body
        ex = self._pending.pop(id(response.request), None)
        if ex is None:
            return
        headers = tuple(
            (k, self.mask(v)) for k, v in response.headers.items() if k.lower() in RESPONSE_HEADERS
        )
        text = response.content.decode("utf-8", "replace")[:BODY_LIMIT]
        done = Exchange(
            ex.probe,
            ex.method,
            ex.url,
            ex.request_headers,
            ex.request_body,
            response.status_code,
            headers,
            self.mask(text),
        )
        self.exchanges[self.exchanges.index(ex)] = done

    def finish(self, outcome: str, error: str | None = None) -> Exchange | None:
        """Close the probe's last exchange with what the client made of it (and a connection error)."""
        if not self.exchanges or self.exchanges[-1].probe != self.probe:
            # the client refused to send it (an invalid header value): nothing went out
            self.exchanges.append(Exchange(self.probe, "-", "(not sent)", error=self.mask(error or outcome)))
            return self.exchanges[-1]
        last = self.exchanges[-1]
        if error is not None and last.status is None:
            last = Exchange(
                last.probe,
                last.method,
                last.url,
                last.request_headers,
                last.request_body,
                error=self.mask(error),
            )
        last = Exchange(
            last.probe,
            last.method,
            last.url,
            last.request_headers,
            last.request_body,
            last.status,
            last.response_headers,
            last.response_body,
            last.error,
            self.mask(outcome),
        )
        self.exchanges[-1] = last
        return last


def by_probe(exchanges: Iterable[Exchange]) -> dict[str, Exchange]:
    """The last exchange of each probe."""
    return {ex.probe: ex for ex in exchanges}

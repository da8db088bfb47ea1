"""The error objects the gateway itself produces: OpenAI's shape, or Anthropic's on /v1/messages.

OpenAI: {"error": {"message", "type", "param", "code"}}. Anthropic: {"type": "error", "error": {"type",
"message"}}, with the status codes Anthropic's API uses (an unavailable upstream is 529
overloaded_error, any other upstream failure 500 api_error), so its SDK raises the matching class.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # aiohttp is imported where a response is made: provision reads Reject through the
    from aiohttp import web  # policy and limits modules and serves nothing (~0.3 s of imports a run)

Style = Literal["openai", "anthropic"]

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout",
}


# gateway status -> (status, error type) on the Anthropic route, per Anthropic's API errors page
_ANTHROPIC: dict[int, tuple[int, str]] = {
    400: (400, "invalid_request_error"),
    401: (401, "authentication_error"),
    403: (403, "permission_error"),
    404: (404, "not_found_error"),
    405: (405, "invalid_request_error"),
    408: (408, "invalid_request_error"),
    413: (413, "request_too_large"),
    429: (429, "rate_limit_error"),
    502: (500, "api_error"),
    503: (529, "overloaded_error"),
    504: (500, "api_error"),
}


def anthropic_status(status: int) -> tuple[int, str]:
    """The status and error type Anthropic's API would answer for a gateway error status."""
    return _ANTHROPIC.get(status, (500, "api_error"))


def error_body(status: int, message: str, code: str | None = None, param: str | None = None) -> bytes:
    """The JSON bytes of an OpenAI error object."""
    err = {"message": message, "type": _TYPES.get(status, "server_error"), "param": param, "code": code}
    return json.dumps({"error": err}).encode()


def anthropic_error_body(err_type: str, message: str) -> bytes:
    """The JSON bytes of an Anthropic error object."""
    return json.dumps({"type": "error", "error": {"type": err_type, "message": message}}).encode()


def error_response(
    status: int,
    message: str,
    *,
    code: str | None = None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
    style: Style = "openai",
) -> web.Response:
    """An aiohttp response carrying an OpenAI (or, by `style`, an Anthropic) error object."""
    from aiohttp import web

    if style == "anthropic":
        status, err_type = anthropic_status(status)
        body = anthropic_error_body(err_type, message)
    else:
        body = error_body(status, message, code, param)
    return web.Response(status=status, body=body, content_type="application/json", headers=headers)


class Reject(Exception):
    """A request the gateway answers itself with an OpenAI error (status, message, code, param);
    `close`: then close the connection, the rest of the request is not worth reading."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        param: str | None = None,
        close: bool = False,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.close = close
        self.headers = headers  # sent with the error (Retry-After on a 429)

    def response(self, headers: dict[str, str] | None = None, style: Style = "openai") -> web.Response:
        """This rejection as an error response in the route's style."""
        if self.headers:
            headers = {**(headers or {}), **self.headers}
        return error_response(
            self.status, self.message, code=self.code, param=self.param, headers=headers, style=style
        )


def sse_error_event(message: str, code: int = 502, style: Style = "openai") -> bytes:
    """An SSE event with an error object, ending a stream that broke after its first byte (Anthropic:
    an `event: error` as its streaming API sends one)."""
    if style == "anthropic":
        return b"event: error\ndata: " + anthropic_error_body("api_error", message) + b"\n\n"
    err = {"message": message, "type": "upstream_error", "param": None, "code": code}
    return b"data: " + json.dumps({"error": err}).encode() + b"\n\n"

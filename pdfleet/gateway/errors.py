"""OpenAI-style error objects: every error the gateway itself produces has this shape."""

from __future__ import annotations

import json

from aiohttp import web

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


def error_body(status: int, message: str, code: str | None = None, param: str | None = None) -> bytes:
    """The JSON bytes of an OpenAI error object."""
    err = {"message": message, "type": _TYPES.get(status, "server_error"), "param": param, "code": code}
    return json.dumps({"error": err}).encode()


def error_response(
    status: int,
    message: str,
    *,
    code: str | None = None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    """An aiohttp response carrying an OpenAI error object."""
    return web.Response(
        status=status,
        body=error_body(status, message, code, param),
        content_type="application/json",
        headers=headers,
    )


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
    ):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.close = close

    def response(self, headers: dict[str, str] | None = None) -> web.Response:
        """This rejection as an error response."""
        return error_response(self.status, self.message, code=self.code, param=self.param, headers=headers)


def sse_error_event(message: str, code: int = 502) -> bytes:
    """An SSE `data:` event with an error object, ending a stream that broke after its first byte."""
    err = {"message": message, "type": "upstream_error", "param": None, "code": code}
    return b"data: " + json.dumps({"error": err}).encode() + b"\n\n"

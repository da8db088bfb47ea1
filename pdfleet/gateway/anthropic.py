"""The Anthropic Messages route (`POST /v1/messages`): its key headers and the body fields the gateway needs.

vLLM serves the same route (vllm/entrypoints/anthropic/api_router.py, since 0.11.1), so a request is
forwarded as it came; the gateway only authenticates it, checks the fields it routes and limits by,
and answers its own errors in Anthropic's shape (errors.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pdfleet.gateway.errors import Reject
from pdfleet.gateway.keys import AuthResult, authenticate_anthropic
from pdfleet.gateway.policy import ActivePolicy

PATH = "/v1/messages"
ROLES = ("user", "assistant")


def authorize_anthropic(headers: Mapping[str, str], policy: ActivePolicy) -> AuthResult:
    """The key from `x-api-key` or `Authorization: Bearer`; a 401 Reject when it fails."""
    result = authenticate_anthropic(headers.get("x-api-key"), headers.get("Authorization"), policy.keys)
    if result.error is not None:
        raise Reject(401, result.error, code="invalid_api_key")
    return result


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_messages_fields(data: dict[str, Any]) -> None:
    """400 for a missing or mistyped field of a Messages request (the rest is the upstream's business)."""
    msgs = data.get("messages")
    if msgs is None:
        raise Reject(400, "messages: Field required (a list of {role, content} objects)", param="messages")
    if not isinstance(msgs, list) or not msgs:
        raise Reject(400, "messages: must be a non-empty list of {role, content} objects", param="messages")
    for i, msg in enumerate(msgs):
        if not isinstance(msg, dict):
            raise Reject(400, f"messages.{i}: must be an object with role and content", param="messages")
        if msg.get("role") not in ROLES:
            raise Reject(400, f"messages.{i}.role: must be 'user' or 'assistant'", param="messages")
        content = msg.get("content")
        if not isinstance(content, str) and not (isinstance(content, list) and content):
            raise Reject(
                400,
                f"messages.{i}.content: must be a string or a non-empty list of content blocks",
                param="messages",
            )
        if isinstance(content, list) and not all(isinstance(b, dict) for b in content):
            raise Reject(
                400, f"messages.{i}.content: every content block must be an object", param="messages"
            )
    max_tokens = data.get("max_tokens")
    if max_tokens is None:
        raise Reject(400, "max_tokens: Field required", param="max_tokens")
    if not _is_count(max_tokens) or max_tokens < 1:
        raise Reject(400, "max_tokens: must be an integer of at least 1", param="max_tokens")
    system = data.get("system")
    if system is not None and not isinstance(system, str | list):
        raise Reject(400, "system: must be a string or a list of text blocks", param="system")
    stream = data.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise Reject(400, "stream: must be true or false", param="stream")

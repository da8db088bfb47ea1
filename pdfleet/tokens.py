"""Prompt-token counting shared by the simulator and the gateway, so both count the same way.

With a `tokenizer.json` (HF `tokenizers`, optional extra) the count is the model's own. Without one
the count is a deterministic estimate: ASCII characters / chars_per_token plus the UTF-8 bytes of every
other character / 2 (a CJK character is ~1.5 tokens, an emoji ~2: chars/4 undercounted them several
fold), rounded up, at least 1. It is an estimate: a limit on prompt tokens is exact only with a tokenizer.

Chat messages are counted over the text the chat template would see: for each message its role, its
content (text parts of multi-part content: typed `text`, `input_text` or untyped) and its tool calls'
names and arguments, plus a fixed 3 tokens per message for the template's role markers, which is what
Llama-3 templates add; and the request's `tools` and `documents`, which the template renders into the
prompt too (every string in them, keys included). An Anthropic Messages body is counted over the chat
messages vLLM builds from it (`messages_as_chat`) plus its `tools`.

With the model's chat template as well (`HFTokenizer(path, template)`, `pdfleet.chat_template`), a chat
request is counted as the engine counts it: the ids of its rendered prompt (`chat_ids`), which is also
what the simulator's prefix cache hashes and the gateway matches against vLLM's KV events.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pdfleet.chat_template import ChatTemplate
from pdfleet.errors import ValidationError

DEFAULT_CHARS_PER_TOKEN = 4.0
NON_ASCII_BYTES_PER_TOKEN = 2.0
TOKENS_PER_CHAT_MESSAGE = 3
TEXT_PART_TYPES = (None, "text", "input_text")  # content parts whose `text` the template renders


class TextCounter(Protocol):
    """Counts the tokens of a piece of text (tokenizer or estimate)."""

    def count(self, text: str) -> int: ...


@dataclass(frozen=True)
class CharEstimate:
    """Deterministic estimate: ceil(len(text) / chars_per_token), never below 1 for non-empty text."""

    chars_per_token: float = DEFAULT_CHARS_PER_TOKEN

    def count(self, text: str) -> int:
        if not text:
            return 0
        if text.isascii():
            return max(1, math.ceil(len(text) / self.chars_per_token))
        ascii_chars = len(text.encode("ascii", "ignore"))
        other_bytes = len(text.encode("utf-8", "surrogatepass")) - ascii_chars
        return max(1, math.ceil(ascii_chars / self.chars_per_token + other_bytes / NON_ASCII_BYTES_PER_TOKEN))


class HFTokenizer:
    """The model's own tokenizer from a tokenizer.json file (needs the `tokenizers` package)."""

    def __init__(self, path: str | Path, template: ChatTemplate | None = None) -> None:
        self.template = template  # the model's chat template: chat requests counted as rendered
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:  # pragma: no cover - depends on the optional extra
            raise ValidationError(
                f"tokenizer file {path} is configured but the 'tokenizers' package is not installed; "
                "install pdfleet[tokenizer] or remove the tokenizer setting"
            ) from exc
        self._tok = Tokenizer.from_file(str(path))

    def encode(self, text: str) -> list[int]:
        """The token ids `count` counts (the simulator's prefix cache hashes them)."""
        if not text:
            return []
        return list(self._tok.encode_batch([text], add_special_tokens=False)[0].ids)

    def count(self, text: str) -> int:
        if not text:
            return 0
        # encode_batch releases the GIL while it encodes (encode does not): counting in a worker thread
        # then does not stall an event loop (the simulator's intake thread)
        return len(self._tok.encode_batch([text], add_special_tokens=False)[0].ids)

    def chat_ids(self, body: dict[str, Any]) -> list[int] | None:
        """A chat request's prompt ids as the engine prefills them: rendered by the chat template, tokenized
        without special tokens (None: no template, or a request it does not reproduce)."""
        if self.template is None:
            return None
        text = self.template.render(body)
        return None if text is None else self.encode(text)


def make_counter(
    tokenizer_path: str | Path | None,
    chars_per_token: float = DEFAULT_CHARS_PER_TOKEN,
    template: ChatTemplate | None = None,
) -> TextCounter:
    """The tokenizer (with the model's chat template, when given) when a path is given, else the
    character estimate."""
    if tokenizer_path:
        return HFTokenizer(tokenizer_path, template)
    return CharEstimate(chars_per_token)


def chat_ids(body: dict[str, Any], counter: TextCounter) -> list[int] | None:
    """A chat request's prompt ids when the counter renders the model's chat template, else None."""
    render = getattr(counter, "chat_ids", None)
    return None if render is None or not isinstance(body.get("messages"), list) else render(body)


def _content_text(content: Any) -> str:
    """A message content as text: a string, or the text parts of a multi-part list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            p["text"]
            for p in content
            if isinstance(p, dict) and p.get("type") in TEXT_PART_TYPES and isinstance(p.get("text"), str)
        ]
        return "\n".join(parts)
    return ""


def strings_of(value: Any) -> str:
    """Every string in a JSON value (keys included, numbers as text), newline-joined; iterative, so a
    deeply nested value is counted rather than a way around the count."""
    out: list[str] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict):
            out.extend(str(k) for k in item)
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list):
            stack.extend(reversed(item))
        elif isinstance(item, int | float) and not isinstance(item, bool):
            out.append(str(item))
    return "\n".join(out)


def count_chat_tokens(messages: list[Any], counter: TextCounter) -> int:
    """Tokens of a chat request's messages (see the module docstring for the rule)."""
    total = 0
    for msg in messages:
        if not isinstance(msg, dict):
            continue
        total += (
            TOKENS_PER_CHAT_MESSAGE
            + counter.count(str(msg.get("role", "")))
            + counter.count(_content_text(msg.get("content")))
        )
        calls = msg.get("tool_calls")
        if calls:  # a function's name and arguments (a JSON string, or an object from a lax client)
            total += counter.count(strings_of(calls))
    return total


def count_completion_tokens(prompt: Any, counter: TextCounter) -> int:
    """Tokens of a completions request's `prompt`: a string, a list of strings, or token id lists."""
    if isinstance(prompt, str):
        return counter.count(prompt)
    if isinstance(prompt, list):
        if all(isinstance(t, int) for t in prompt):
            return len(prompt)
        return sum(count_completion_tokens(p, counter) for p in prompt)
    return 0


def count_request_tokens(body: dict[str, Any], counter: TextCounter) -> int:
    """Prompt tokens of an OpenAI chat or completions request body."""
    if "messages" in body:
        ids = chat_ids(body, counter)
        if ids is not None:
            return len(ids)
        msgs = body["messages"]
        rendered = strings_of([body.get("tools"), body.get("documents")])
        return count_chat_tokens(msgs if isinstance(msgs, list) else [], counter) + counter.count(rendered)
    return count_completion_tokens(body.get("prompt"), counter)


def _block_text(blocks: Any) -> str:
    """The text of an Anthropic content value: a string, or its text blocks concatenated."""
    if isinstance(blocks, str):
        return blocks
    if isinstance(blocks, list):
        return "".join(
            b["text"]
            for b in blocks
            if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
        )
    return ""


def messages_as_chat(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The OpenAI chat messages an Anthropic Messages body becomes in vLLM: `system` first, each message's
    text blocks as its content, a tool_use block's input as JSON text, a tool_result as a `tool` message."""
    out: list[dict[str, Any]] = []
    system = _block_text(body.get("system"))
    if system:
        out.append({"role": "system", "content": system})
    msgs = body.get("messages")
    for msg in msgs if isinstance(msgs, list) else []:
        if not isinstance(msg, dict):
            continue
        role, content = msg.get("role"), msg.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        parts: list[dict[str, Any]] = []
        for block in content if isinstance(content, list) else []:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "text" and isinstance(block.get("text"), str) and block["text"]:
                parts.append({"type": "text", "text": block["text"]})
            elif kind == "tool_use":
                parts.append({"type": "text", "text": json.dumps(block.get("input") or {})})
            elif kind == "tool_result":
                out.append({"role": "tool", "content": _block_text(block.get("content"))})
        if parts:
            one = len(parts) == 1
            out.append({"role": role, "content": parts[0]["text"] if one else parts})
    return out


def count_messages_tokens(body: dict[str, Any], counter: TextCounter) -> int:
    """Prompt tokens of an Anthropic Messages request body (system + messages content blocks + tools)."""
    return count_chat_tokens(messages_as_chat(body), counter) + counter.count(strings_of(body.get("tools")))

"""What one request's output is written to: the `Sink` (a streamed SSE body or a future for one JSON
response), vLLM's SSE event framing over HTTP/1.1 chunked encoding, and the deterministic filler tokens.

The step loop (`pdfleet.sim.runtime`) writes each token straight to the sink's transport using the
byte strings prepared here once per request, so a token costs one formatted write and no JSON encoding.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from typing import Any

# One word per output token, cycled: deterministic, and every token is valid JSON string content.
FILLER = tuple(
    f" {w}"
    for w in (
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "a",
        "lazy",
        "dog",
        "while",
        "tokens",
        "stream",
        "at",
        "the",
        "pace",
        "of",
        "a",
        "simulated",
        "GPU",
        "and",
        "nothing",
        "here",
        "is",
        "real",
    )
)


class Filler:
    """The output tokens a server cycles through: text pieces that go into a JSON string as they are.

    With a tokenizer configured they are tokens of its vocabulary chosen so that the streamed text
    re-tokenizes to exactly the reported count (`pdfleet.sim.vocab`); otherwise the filler words.
    """

    __slots__ = ("words", "tokens")

    def __init__(self, words: tuple[str, ...]) -> None:
        if not words:
            raise ValueError("a filler needs at least one token")
        self.words = words
        self.tokens = tuple(w.encode() for w in words)

    def text(self, n: int) -> str:
        """The text of the first n output tokens."""
        words = self.words
        k = len(words)
        return "".join(words[i % k] for i in range(n))


DEFAULT_FILLER = Filler(FILLER)

compact = functools.partial(json.dumps, separators=(",", ":"))  # JSON as FastAPI/pydantic writes it


def sse_event(obj: Any) -> bytes:
    """One SSE event: `data: {json}` and a blank line."""
    return b"data: " + compact(obj).encode() + b"\n\n"


def chunk_frame(data: bytes) -> bytes:
    """One HTTP/1.1 chunked-encoding frame."""
    return b"%x\r\n%s\r\n" % (len(data), data)


class Sink:
    """Where a request's output goes: a streamed SSE body or a future for a JSON response."""

    __slots__ = (
        "kind",
        "chunk_object",
        "stream",
        "transport",
        "prefix",
        "mid",
        "created",
        "rid",
        "model",
        "include_usage",
        "done",
        "finish_reason",
        "error",
        "role_sent",
    )

    def __init__(
        self,
        kind: str,
        rid: str,
        model: str,
        stream: bool,
        include_usage: bool,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.kind = kind
        self.chunk_object = "chat.completion.chunk" if kind == "chat" else "text_completion"
        self.rid = rid
        self.model = model
        self.stream = stream
        self.include_usage = include_usage
        self.created = int(time.time())
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[None] = loop.create_future()
        self.finish_reason = "length"
        self.error: str | None = None
        self.role_sent = False  # the first write (chat: role event + first token) is framed separately
        head = {
            "id": rid,
            "object": self.chunk_object,
            "created": self.created,
            "model": model,
        }
        opening = compact(head)[:-1]
        if kind == "chat":
            self.prefix = ("data: " + opening + ',"choices":[{"index":0,"delta":{"content":"').encode()
            self.mid = b'"},"logprobs":null,"finish_reason":null}]}\n\n'
        else:
            self.prefix = ("data: " + opening + ',"choices":[{"index":0,"text":"').encode()
            self.mid = b'","logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'

    def role_event(self) -> bytes:
        """The chat stream's first event (role only); vLLM sends it with the first engine output."""
        head = {
            "id": self.rid,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
        }
        return sse_event(head)

    def last_suffix(self) -> bytes:
        """What follows the last token: its event's end, carrying the finish reason."""
        if self.kind == "chat":
            end = f'"}},"logprobs":null,"finish_reason":"{self.finish_reason}","stop_reason":null}}]}}\n\n'
            return end.encode()
        return (
            f'","logprobs":null,"finish_reason":"{self.finish_reason}","stop_reason":null}}]}}\n\n'.encode()
        )

    def settle(self, error: str | None = None) -> None:
        """The request is over (with `error`, a failure): wake the handler waiting on `done`."""
        if error is not None:
            self.error = error
        if not self.done.done():
            self.done.set_result(None)

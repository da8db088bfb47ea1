"""Which prompt prefixes each candidate (a colocated instance, the P/D pool) probably has cached: an
approximate index the gateway keeps from its own routing, with no engine change (issue 32).

A prompt is cut into blocks of `block_tokens` tokens' worth of its text (the policy estimator's
characters per token), each block's hash chained to the one before, as vLLM chains its prefix-cache
block hashes; so a block matches only when the whole prefix up to it matches. Each candidate keeps at
most `index_blocks` hashes, least recently routed first out. A prompt's blocks are recorded last block
first, so its earlier blocks are the more recent and are forgotten last: a recorded block's parent is
then always still there, and the cached prefix is found by bisection.

`CacheSource` is the interface the gateway reads: vLLM's KV-cache events (`--kv-events-config`) can be a
second source behind it later.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Protocol

from pdfleet.tokens import _content_text, messages_as_chat, strings_of


class CacheSource(Protocol):
    """Cached prompt tokens per candidate, and what the gateway routed where."""

    def cached_tokens(self, candidate: str, blocks: Sequence[int], tokens: int) -> int:
        """Tokens of a prompt (`tokens` in all, cut into `blocks`) the candidate has cached."""

    def record(self, candidate: str, blocks: Sequence[int]) -> None:
        """The prompt was sent to the candidate: it will hold these blocks."""


def prompt_text(data: dict[str, Any], endpoint: str) -> str | list[int]:
    """What the engine prefills, in order, as text (a chat's tools and messages; a completion's prompt);
    a completion given as token ids: the ids."""
    if endpoint == "messages":
        msgs: Any = messages_as_chat(data)
        head = strings_of(data.get("tools"))
    elif "messages" in data:
        msgs = data.get("messages")
        head = strings_of([data.get("tools"), data.get("documents")])
    else:
        prompt = data.get("prompt")
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        return prompt if isinstance(prompt, str) else strings_of(prompt)
    parts = [head]
    for msg in msgs if isinstance(msgs, list) else []:
        if isinstance(msg, dict):
            parts.append(f"\x00{msg.get('role', '')}\x00{_content_text(msg.get('content'))}")
            if msg.get("tool_calls"):
                parts.append(strings_of(msg["tool_calls"]))
    return "".join(parts)


def prompt_blocks(prompt: str | list[int], block_tokens: int, chars_per_token: float) -> list[int]:
    """The chained hashes of a prompt's whole blocks (a last partial block is not cached by vLLM either)."""
    if isinstance(prompt, list):
        size = block_tokens
        whole = len(prompt) - len(prompt) % size
        chunks: list[Any] = [tuple(prompt[i : i + size]) for i in range(0, whole, size)]
    else:
        size = max(1, round(block_tokens * chars_per_token))
        whole = len(prompt) - len(prompt) % size
        chunks = [prompt[i : i + size] for i in range(0, whole, size)]
    out = []
    parent = 0
    for chunk in chunks:
        parent = hash((parent, chunk))
        out.append(parent)
    return out


class PrefixIndex:
    """Per candidate, an LRU set of block hashes bounded at `capacity` blocks (see the module docstring)."""

    def __init__(self, capacity: int, block_tokens: int) -> None:
        self.capacity = capacity
        self.block_tokens = block_tokens
        self._sets: dict[str, OrderedDict[int, None]] = {}

    def cached_tokens(self, candidate: str, blocks: Sequence[int], tokens: int) -> int:
        """The prompt's tokens in its longest recorded prefix (bisection: see the module docstring)."""
        held = self._sets.get(candidate)
        if not held or not blocks:
            return 0
        lo, hi = 0, len(blocks)  # blocks[:lo] are held; blocks[hi:] are not
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if blocks[mid - 1] in held:
                lo = mid
            else:
                hi = mid - 1
        return min(tokens, lo * self.block_tokens)

    def record(self, candidate: str, blocks: Sequence[int]) -> None:
        """The prompt's blocks, last first, become the candidate's most recent; the oldest beyond the
        capacity are forgotten."""
        held = self._sets.get(candidate)
        if held is None:
            held = self._sets[candidate] = OrderedDict()
        for h in reversed(blocks):
            if h in held:
                held.move_to_end(h)
            else:
                held[h] = None
        while len(held) > self.capacity:
            held.popitem(last=False)

    def size(self, candidate: str) -> int:
        """Blocks held for a candidate."""
        return len(self._sets.get(candidate, ()))

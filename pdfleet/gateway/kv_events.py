"""vLLM's KV-cache events as a source of cached prompt tokens: the second implementation of the prefix
index's `CacheSource` (issue 32).

An engine started with `--kv-events-config` publishes each block its prefix cache stores or evicts
(`pdfleet.model.vllm_kv_events` tables the format of each release). `KvEventIndex` applies those events
per candidate and answers the same question as the gateway's own prefix index: how many tokens of a
prompt, cut into the index's chained block hashes, the candidate holds. `BlockStored` carries the token
ids of its blocks, so the index chains its own hashes of token ids exactly as `prompt_blocks` does for
a prompt given as token ids, and never needs vLLM's hash function or its seed; the engine's hashes only
link a block to its parent and name it in `BlockRemoved`. What it cannot know:

- a prompt given as text, unless its alias names the model's tokenizer directory (`tokenizer:`; then a
  chat prompt is rendered and tokenized as the engine does, `pdfleet.gateway.prompt_ids`): the
  engine's ids come from the model's tokenizer and chat template, so without them a text prompt's
  blocks never match (0 cached: a lower bound), nor do completions' text prompts or Anthropic Messages;
- a request's `cache_salt` (vLLM mixes it into the first block's hash, its events still carry the ids):
  a salted prompt is counted as if unsalted;
- blocks stored before the gateway subscribed (their parent is unknown, so nothing chained under them
  is found until the prefix is stored again): an undercount until then, never an overcount;
- events the publisher dropped (ZMQ's high-water mark): a removal missed keeps a block counted.

The msgpack decoding is the subset vLLM's batches use (nil, booleans, integers, floats, strings, bytes,
arrays, maps), checked against bytes `msgspec` encodes with the releases' own classes; pdfleet's hosts
need no msgpack library for it.
"""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pdfleet.model.vllm_kv_events import TAG_FIELD, EventFormat

EngineHash = int | bytes


class KvEventError(ValueError):
    """A payload that is not a KV event batch of the expected release."""


def unpack(data: bytes) -> Any:
    """One msgpack object (the whole payload)."""
    value, end = _unpack(data, 0)
    if end != len(data):
        raise KvEventError(f"{len(data) - end} bytes after the msgpack object")
    return value


_FIXED = {0xC0: None, 0xC2: False, 0xC3: True}
_SIZED = {  # first byte: (struct format of the value, its size)
    0xCA: (">f", 4),
    0xCB: (">d", 8),
    0xCC: (">B", 1),
    0xCD: (">H", 2),
    0xCE: (">I", 4),
    0xCF: (">Q", 8),
    0xD0: (">b", 1),
    0xD1: (">h", 2),
    0xD2: (">i", 4),
    0xD3: (">q", 8),
}
_LENGTH = {  # first byte: (kind, struct format of the length, its size)
    0xC4: ("bin", ">B", 1),
    0xC5: ("bin", ">H", 2),
    0xC6: ("bin", ">I", 4),
    0xD9: ("str", ">B", 1),
    0xDA: ("str", ">H", 2),
    0xDB: ("str", ">I", 4),
    0xDC: ("array", ">H", 2),
    0xDD: ("array", ">I", 4),
    0xDE: ("map", ">H", 2),
    0xDF: ("map", ">I", 4),
}


def _unpack(data: bytes, at: int) -> tuple[Any, int]:
    if at >= len(data):
        raise KvEventError("msgpack object cut short")
    b = data[at]
    at += 1
    if b <= 0x7F:
        return b, at
    if b >= 0xE0:
        return b - 0x100, at
    if 0xA0 <= b <= 0xBF:
        return _take(data, at, b & 0x1F, "str")
    if 0x90 <= b <= 0x9F:
        return _items(data, at, b & 0x0F, "array")
    if 0x80 <= b <= 0x8F:
        return _items(data, at, b & 0x0F, "map")
    if b in _FIXED:
        return _FIXED[b], at
    if b in _SIZED:
        fmt, size = _SIZED[b]
        _need(data, at, size)
        return struct.unpack_from(fmt, data, at)[0], at + size
    if b in _LENGTH:
        kind, fmt, size = _LENGTH[b]
        _need(data, at, size)
        n = struct.unpack_from(fmt, data, at)[0]
        if kind in ("array", "map"):
            return _items(data, at + size, n, kind)
        return _take(data, at + size, n, kind)
    raise KvEventError(f"msgpack type 0x{b:02x} is not used by vLLM's KV events")


def _need(data: bytes, at: int, n: int) -> None:
    if at + n > len(data):
        raise KvEventError("msgpack object cut short")


def _take(data: bytes, at: int, n: int, kind: str) -> tuple[Any, int]:
    _need(data, at, n)
    raw = data[at : at + n]
    return (raw.decode("utf-8") if kind == "str" else bytes(raw)), at + n


def _items(data: bytes, at: int, n: int, kind: str) -> tuple[Any, int]:
    if kind == "array":
        out = []
        for _ in range(n):
            value, at = _unpack(data, at)
            out.append(value)
        return out, at
    mapping = {}
    for _ in range(n):
        key, at = _unpack(data, at)
        value, at = _unpack(data, at)
        mapping[key] = value
    return mapping, at


@dataclass(slots=True)
class Stored:
    """Blocks the engine cached: their hashes, their first one's parent, all their token ids."""

    hashes: list[EngineHash]
    parent: EngineHash | None
    token_ids: list[int]
    block_size: int


@dataclass(slots=True)
class Removed:
    """Blocks the engine evicted."""

    hashes: list[EngineHash]


@dataclass(slots=True)
class Cleared:
    """The engine reset its prefix cache."""


Event = Stored | Removed | Cleared


@dataclass(slots=True)
class Batch:
    ts: float
    events: list[Event] = field(default_factory=list)
    data_parallel_rank: int | None = None


def parse_batch(payload: bytes, fmt: EventFormat) -> Batch:
    """A published batch's events (an unknown event tag is skipped: a later release may add one)."""
    raw = unpack(payload)
    if not isinstance(raw, list) or len(raw) < 2 or not isinstance(raw[1], list):
        raise KvEventError("not an EventBatch (an array of ts, events[, data_parallel_rank])")
    batch = Batch(float(raw[0]), [], raw[2] if len(raw) > 2 else None)
    for item in raw[1]:
        event = _event(item, fmt)
        if event is not None:
            batch.events.append(event)
    return batch


def _event(item: Any, fmt: EventFormat) -> Event | None:
    """One event from its array form ([tag, fields...]) or its map form ({"type": tag, field: ...})."""
    if isinstance(item, list) and item and isinstance(item[0], str):
        tag = item[0]
        values = dict(zip(fmt.fields(tag), item[1:], strict=False))
    elif isinstance(item, dict) and isinstance(item.get(TAG_FIELD), str):
        tag, values = item[TAG_FIELD], item
    else:
        raise KvEventError(f"not a tagged KV event: {item!r:.80}")
    if tag == "BlockStored":
        return Stored(
            list(values["block_hashes"]),
            values.get("parent_block_hash"),
            list(values["token_ids"]),
            int(values["block_size"]),
        )
    if tag == "BlockRemoved":
        return Removed(list(values["block_hashes"]))
    if tag == "AllBlocksCleared":
        return Cleared()
    return None


class KvEventIndex:
    """Per candidate, the blocks its engine reports cached, named by the gateway's chained hashes of
    their token ids (`prompt_blocks`'s for a token-id prompt), so `cached_tokens` reads like the prefix
    index's; `record` does nothing (the engine says what it holds)."""

    def __init__(self, block_tokens: int) -> None:
        self.block_tokens = block_tokens
        self._own: dict[str, dict[EngineHash, int]] = {}  # engine hash -> own chained hash
        self._held: dict[str, Counter[int]] = {}  # own hashes held (two engine hashes may share one)

    def apply(self, candidate: str, batch: Batch) -> None:
        """A batch the candidate's engine published, in order."""
        own = self._own.setdefault(candidate, {})
        held = self._held.setdefault(candidate, Counter())
        for event in batch.events:
            if isinstance(event, Stored):
                self._store(own, held, event)
            elif isinstance(event, Removed):
                for h in event.hashes:
                    mine = own.pop(h, None)
                    if mine is not None:
                        held[mine] -= 1
                        if held[mine] <= 0:
                            del held[mine]
            else:
                own.clear()
                held.clear()

    @staticmethod
    def _store(own: dict[EngineHash, int], held: Counter[int], event: Stored) -> None:
        parent = 0 if event.parent is None else own.get(event.parent)
        if parent is None:
            return  # stored under a block the gateway never saw stored: it cannot be chained
        size = event.block_size
        for i, h in enumerate(event.hashes):
            chunk = event.token_ids[i * size : (i + 1) * size]
            if len(chunk) < size:
                return
            parent = hash((parent, tuple(chunk)))
            if h not in own:
                own[h] = parent
                held[parent] += 1

    def cached_tokens(self, candidate: str, blocks: Sequence[int], tokens: int) -> int:
        """The prompt's tokens in its longest prefix of blocks the engine holds."""
        held = self._held.get(candidate)
        if not held:
            return 0
        n = 0
        for h in blocks:
            if h not in held:
                break
            n += 1
        return min(tokens, n * self.block_tokens)

    def record(self, candidate: str, blocks: Sequence[int]) -> None:
        """Nothing: the engine's events say what it cached."""

    def forget(self, candidate: str) -> None:
        """Drop what the candidate held (its feed lost events or its connection: unknown, not cached)."""
        self._own.pop(candidate, None)
        self._held.pop(candidate, None)

    def size(self, candidate: str) -> int:
        """Blocks held for a candidate."""
        return sum(self._held.get(candidate, Counter()).values())

"""The simulator's KV-cache events, published as the pinned vLLM release publishes them (issue 32).

`--kv-events-config` is read as the release's `KVEventsConfig` (`pdfleet.model.vllm_kv_events`): its
keys and defaults, `publisher` defaulting to `zmq` when events are enabled (0.11.1+; `null` in 0.11.0).
With `zmq`, a PUB socket is bound at `endpoint` (`tcp://*:5557` by default; `*` is every address) and
each engine step's events go out as vLLM's `ZmqEventPublisher` sends them: the topic, an 8-byte
big-endian sequence number from 0, and the msgpack `EventBatch(ts, events, data_parallel_rank=0)`,
each event in the release's form (an array led by its tag up to 0.11.2; a map with a `type` key from
0.33, with the fields 0.33's block pool sets: `extra_keys` one nil per block, `group_idx` 0).

The events' block hashes are the simulator's own chained prefix hashes (blake2b, `pdfleet.sim.blocks`),
published as their low 64 bits as vLLM publishes its sha256 ones under
`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`: a consumer must treat them as opaque names, as it must vLLM's.
`BlockStored.token_ids` are the prompt's token ids, which the simulator has when it runs a tokenizer or
a completion is sent as token ids (a chat prompt's are its rendered chat template's, as vLLM's, when the
tokenizer's directory has a template: `pdfleet.chat_template`); a block of text pieces (no tokenizer)
or of a chat prompt without a template (its role markers have no ids) is not published.
With `replay_endpoint` set, a ROUTER there serves the last `buffer_steps` batches as the release's
`_service_replay` does (`KvEventPublisher`). `hwm` (libzmq's bound in messages) is not modeled: a
subscriber more than 64 MiB behind misses messages, as one past its high-water mark does.
"""

from __future__ import annotations

import json
import struct
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pdfleet.errors import ValidationError
from pdfleet.model.vllm_kv_events import TAG_FIELD, EventFormat
from pdfleet.zmtp import Publisher, Router

MEDIUM_GPU = "GPU"


@dataclass(frozen=True)
class KvEventsSettings:
    """The parts of --kv-events-config the simulator acts on."""

    host: str
    port: int
    topic: str
    replay: tuple[str, int] | None = None  # replay_endpoint's ROUTER (host, port), when set
    buffer_steps: int = 10_000  # the batches kept for replay


def parse_kv_events_config(text: str | None, fmt: EventFormat) -> KvEventsSettings | None:
    """--kv-events-config as the release reads it: None when events are off or the publisher is `null`."""
    if not text:
        return None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValidationError(f"--kv-events-config: not valid JSON ({exc.msg} at char {exc.pos})") from exc
    if not isinstance(raw, dict):
        raise ValidationError("--kv-events-config: must be a JSON object")
    known = dict(fmt.config)
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ValidationError(f"--kv-events-config: unknown field(s) {', '.join(unknown)} for KVEventsConfig")
    cfg = {**known, **raw}
    enabled = bool(cfg["enable_kv_cache_events"])
    publisher = cfg["publisher"] if cfg["publisher"] is not None else ("zmq" if enabled else "null")
    if publisher not in ("null", "zmq"):
        raise ValidationError(f"--kv-events-config: publisher {publisher!r}: the simulator has null and zmq")
    if not enabled or publisher == "null":
        return None
    host, port = _tcp(str(cfg["endpoint"]), "endpoint")
    replay = cfg.get("replay_endpoint")
    steps = cfg.get("buffer_steps", 10_000)
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValidationError(f"--kv-events-config: buffer_steps {steps!r}: a positive integer")
    return KvEventsSettings(
        host, port, str(cfg["topic"]), None if replay is None else _tcp(str(replay), "replay_endpoint"), steps
    )


def _tcp(endpoint: str, key: str) -> tuple[str, int]:
    """A tcp://HOST:PORT endpoint as the (host, port) to bind (`*`: every address, "")."""
    scheme, _, rest = endpoint.partition("://")
    host, _, port = rest.rpartition(":")
    if scheme != "tcp" or not port.isdigit() or not host:
        raise ValidationError(f"--kv-events-config: {key} {endpoint!r}: the simulator binds tcp://HOST:PORT")
    return ("" if host == "*" else host), int(port)


def pack(value: Any) -> bytes:
    """msgpack, as msgspec encodes these types (the smallest integer form, floats as float64)."""
    out = bytearray()
    _pack(value, out)
    return bytes(out)


def _pack(v: Any, out: bytearray) -> None:
    if v is None or isinstance(v, bool):
        out.append({None: 0xC0, False: 0xC2, True: 0xC3}[v])
    elif isinstance(v, int):
        _pack_int(v, out)
    elif isinstance(v, float):
        out += struct.pack(">Bd", 0xCB, v)
    elif isinstance(v, str):
        _pack_len(len(b := v.encode()), out, 0xA0, 31, (0xD9, 0xDA, 0xDB))
        out += b
    elif isinstance(v, bytes):
        _pack_len(len(v), out, None, 0, (0xC4, 0xC5, 0xC6))
        out += v
    elif isinstance(v, list | tuple):
        _pack_len(len(v), out, 0x90, 15, (None, 0xDC, 0xDD))
        for item in v:
            _pack(item, out)
    elif isinstance(v, dict):
        # a struct's map header is sized for all its fields, as msgspec writes it before omitting defaults
        _pack_len(len(v), out, 0x80, 15 if getattr(v, "capacity", 0) <= 15 else -1, (None, 0xDE, 0xDF))
        for key, item in v.items():
            _pack(key, out)
            _pack(item, out)
    else:
        raise TypeError(f"not packed: {type(v).__name__}")


def _pack_int(v: int, out: bytearray) -> None:
    if 0 <= v <= 0x7F or -32 <= v < 0:
        out += struct.pack(">b" if v < 0 else ">B", v)
        return
    forms = ((0xCC, ">B", 8), (0xCD, ">H", 16), (0xCE, ">I", 32), (0xCF, ">Q", 64))
    if v < 0:
        forms = ((0xD0, ">b", 7), (0xD1, ">h", 15), (0xD2, ">i", 31), (0xD3, ">q", 63))
    for first, fmt, bits in forms:
        if (v < 1 << bits) if v >= 0 else (v >= -(1 << bits)):
            out.append(first)
            out += struct.pack(fmt, v)
            return
    raise OverflowError(f"{v} does not fit msgpack's 64 bits")


def _pack_len(
    n: int, out: bytearray, fix: int | None, fix_max: int, forms: tuple[int | None, int, int]
) -> None:
    if fix is not None and n <= fix_max:
        out.append(fix | n)
    elif forms[0] is not None and n <= 0xFF:
        out += struct.pack(">BB", forms[0], n)
    elif n <= 0xFFFF:
        out += struct.pack(">BH", forms[1], n)
    else:
        out += struct.pack(">BI", forms[2], n)


def external_hash(block_hash: bytes) -> int:
    """A block hash as vLLM publishes one with integer hashes on: its low 64 bits."""
    return int.from_bytes(block_hash, "big") & ((1 << 64) - 1)


def stored(
    fmt: EventFormat, hashes: Sequence[bytes], parent: bytes | None, ids: Sequence[int], size: int
) -> Any:
    """A BlockStored event in the release's form (no LoRA, GPU medium)."""
    values: dict[str, Any] = {
        "block_hashes": [external_hash(h) for h in hashes],
        "parent_block_hash": None if parent is None else external_hash(parent),
        "token_ids": list(ids),
        "block_size": size,
        "lora_id": None,
        "medium": MEDIUM_GPU,
    }
    if "group_idx" in fmt.stored:  # 0.33's block pool: lora_name, one extra-keys entry a block, group 0
        values |= {"lora_name": None, "extra_keys": [None] * len(hashes), "group_idx": 0}
    return _event(fmt, "BlockStored", fmt.stored, values)


def removed(fmt: EventFormat, hashes: Sequence[bytes]) -> Any:
    """A BlockRemoved event in the release's form."""
    values: dict[str, Any] = {"block_hashes": [external_hash(h) for h in hashes], "medium": MEDIUM_GPU}
    if "group_idx" in fmt.removed:
        values["group_idx"] = 0
    return _event(fmt, "BlockRemoved", fmt.removed, values)


def _event(fmt: EventFormat, tag: str, fields: tuple[str, ...], values: dict[str, Any]) -> Any:
    """An array led by the tag, or a map with the tag first; a defaulted field at its default left out."""
    if fmt.events_array_like:
        return [tag, *(values.get(f) for f in fields)]
    return StructMap(1 + len(fields), {TAG_FIELD: tag, **{f: values[f] for f in fields if f in values}})


class StructMap(dict[str, Any]):
    """A struct encoded as a map: `capacity` is its tag and fields, set or not (the header's size)."""

    def __init__(self, capacity: int, items: dict[str, Any]) -> None:
        super().__init__(items)
        self.capacity = capacity


def batch(events: list[Any], ts: float | None = None) -> bytes:
    """An EventBatch as the publisher sends it (data parallel rank 0)."""
    return pack([time.time() if ts is None else ts, events, 0])


END_SEQ = (-1).to_bytes(8, "big", signed=True)  # the replay's end marker (vLLM's ZmqEventPublisher)


class KvEventPublisher:
    """The PUB socket and the sequence numbers: one message per published batch; the last
    `buffer_steps` batches kept, and a ROUTER at `replay_endpoint` (when set) serving them as vLLM's
    `_service_replay` does: a request is an empty delimiter frame and an 8-byte big-endian start
    sequence number; every kept batch from it is sent as (empty, topic, seq, payload), then (empty,
    empty, -1, empty); a request of another shape is ignored."""

    def __init__(self, pub: Publisher, topic: str, buffer_steps: int = 10_000) -> None:
        self.pub = pub
        self.topic = topic.encode()
        self.seq = 0
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self.replay: Router | None = None

    @classmethod
    async def start(cls, settings: KvEventsSettings) -> KvEventPublisher:
        pub = cls(await Publisher.bind(settings.host, settings.port), settings.topic, settings.buffer_steps)
        if settings.replay is not None:
            pub.replay = await Router.bind(*settings.replay, pub.answer)
        return pub

    def publish(self, events: list[Any], ts: float | None = None) -> None:
        """One batch (nothing when there are no events, as vLLM's scheduler publishes none)."""
        if not events:
            return
        payload = batch(events, ts)
        self.pub.send([self.topic, self.seq.to_bytes(8, "big"), payload])
        self.buffer.append((self.seq, payload))
        self.seq += 1

    def answer(self, request: list[bytes]) -> list[list[bytes]]:
        """A replay request's answer (see the class docstring)."""
        if len(request) != 2 or request[0] != b"":
            return []
        start = int.from_bytes(request[1], "big")
        out = [[b"", self.topic, seq.to_bytes(8, "big"), buf] for seq, buf in self.buffer if seq >= start]
        return [*out, [b"", b"", END_SEQ, b""]]

    async def close(self) -> None:
        if self.replay is not None:
            await self.replay.close()
        await self.pub.close()


class BlockTokens:
    """The token ids of each full prompt block by its hash, as the intake hashed them (text pieces have
    none), the `capacity` most recent kept: what a BlockStored event carries."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._ids: OrderedDict[bytes, tuple[int, ...]] = OrderedDict()
        self._lock = threading.Lock()  # the intake thread registers, the loop reads

    def register(self, hashes: Sequence[bytes], units: Sequence[Any], block_size: int) -> None:
        with self._lock:
            for i, h in enumerate(hashes):
                block = units[i * block_size : (i + 1) * block_size]
                if not all(type(u) is int for u in block):
                    return
                self._ids[h] = tuple(block)
                self._ids.move_to_end(h)
            while len(self._ids) > self.capacity:
                self._ids.popitem(last=False)

    def of(self, h: bytes) -> tuple[int, ...] | None:
        with self._lock:
            return self._ids.get(h)


def step_events(
    fmt: EventFormat, raw: list[tuple[str, list[bytes], bytes | None]], tokens: BlockTokens, size: int
) -> list[Any]:
    """A step's pool events in the release's form: a stored run is cut where a block has no token ids
    (the blocks after it are not published: a consumer could not chain them)."""
    out: list[Any] = []
    for kind, hashes, parent in raw:
        if kind == "removed":
            out.append(removed(fmt, hashes))
            continue
        ids: list[int] = []
        known: list[bytes] = []
        for h in hashes:
            block = tokens.of(h)
            if block is None:
                break
            known.append(h)
            ids.extend(block)
        if known:
            out.append(stored(fmt, known, parent, ids, size))
    return out

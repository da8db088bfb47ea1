"""vLLM's KV-cache events as each supported release publishes them (`--kv-events-config`, issue 32).

Read from the releases' own sources, `vllm/distributed/kv_events.py` and `vllm/config/kv_events.py`
(tests/unit/model/test_vllm_kv_events.py checks this table against every cached wheel):

- An engine with `enable_kv_cache_events` and the `zmq` publisher binds a ZMQ PUB socket at `endpoint`
  (default `tcp://*:5557`; data-parallel rank r adds r to the port) and sends each batch as a three-frame
  message: the topic (`topic`, default empty), an 8-byte big-endian sequence number from 0, and the
  batch encoded by `msgspec.msgpack.Encoder`. A ROUTER socket at `replay_endpoint` (if set) answers an
  8-byte start sequence with the buffered batches from it, then an end marker (sequence -1).
- A batch is `EventBatch(ts, events, data_parallel_rank)`, a msgpack array (`array_like`); its events are
  `BlockStored`, `BlockRemoved` and `AllBlocksCleared`, tagged with their class name. Up to 0.11.2 an
  event is an array whose first item is that tag and then its fields in order; from 0.33 an event is a
  map (`KVCacheEvent` is no longer `array_like`) whose `type` key holds the tag. `omit_defaults`: a field
  still at its default is left out (a map leaves out its key; an array its trailing defaults).
- Block hashes are vLLM's prefix-cache hashes (sha256 of the parent hash, the block's token ids and its
  extra keys, by default), published as the low 64 bits as an integer while
  `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES` is 1 (the default in every tabled release), else as the
  32 bytes. `BlockStored.token_ids` holds the token ids of all its blocks (`block_size` each), so a
  consumer can chain its own hashes of token ids without vLLM's hash function or its seed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

TAG_FIELD = "type"  # msgspec's default tag field for a tagged struct encoded as a map
INT_HASHES_ENV = "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"
SOURCE = "vllm/distributed/kv_events.py"
CONFIG_SOURCE = "vllm/config/kv_events.py"


@dataclass(frozen=True)
class EventFormat:
    """One release's KV event wire format: the events' fields in declaration order (those with a
    default after the required ones), whether an event is an array (else a map), and the config's keys
    with their defaults (`publisher` None: `zmq` when events are enabled, else `null`)."""

    events_array_like: bool
    batch: tuple[str, ...]
    stored: tuple[str, ...]
    stored_required: int
    removed: tuple[str, ...]
    removed_required: int
    config: tuple[tuple[str, object], ...]

    def fields(self, tag: str) -> tuple[str, ...]:
        """An event's fields by its tag ((): no fields, or an unknown tag)."""
        return {"BlockStored": self.stored, "BlockRemoved": self.removed}.get(tag, ())


_BATCH = ("ts", "events", "data_parallel_rank")
_STORED_011 = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium")
_CONFIG_COMMON: tuple[tuple[str, object], ...] = (
    ("endpoint", "tcp://*:5557"),
    ("replay_endpoint", None),
    ("buffer_steps", 10_000),
    ("hwm", 100_000),
    ("max_queue_size", 100_000),
    ("topic", ""),
)
_V0110 = EventFormat(
    events_array_like=True,
    batch=_BATCH,
    stored=_STORED_011,
    stored_required=6,
    removed=("block_hashes", "medium"),
    removed_required=2,
    config=(("enable_kv_cache_events", False), ("publisher", "null"), *_CONFIG_COMMON),
)
# 0.11.1 and 0.11.2: 0.11.0 but for the publisher default (None: zmq when events are enabled)
_V0111 = replace(_V0110, config=(("enable_kv_cache_events", False), ("publisher", None), *_CONFIG_COMMON))
_V0330 = EventFormat(
    events_array_like=False,
    batch=_BATCH,
    stored=(
        *_STORED_011,
        "lora_name",
        "extra_keys",
        "group_idx",
        "kv_cache_spec_kind",
        "kv_cache_spec_sliding_window",
        "locality",
        "ownership",
        "session_id",
        "lookahead_token_ids",
    ),
    stored_required=7,
    removed=("block_hashes", "medium", "group_idx", "locality", "ownership"),
    removed_required=2,
    config=(("enable_kv_cache_events", False), ("publisher", None), *_CONFIG_COMMON),
)
FORMATS: dict[str, EventFormat] = {"0.11.0": _V0110, "0.11.1": _V0111, "0.11.2": _V0111, "0.33.0": _V0330}


def event_format(version: str) -> EventFormat | None:
    """The tabled format of a release (None: not tabled)."""
    return FORMATS.get(version)

"""KV-cache events as a cache source: bytes encoded by each cached wheel's own event classes (msgspec, as
its ZmqEventPublisher encodes them) decode to the same events; the index chains token ids as
`prompt_blocks` does, drops evicted blocks and everything on a clear, and never chains under a parent it
did not see stored; malformed payloads are refused."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from pdfleet.gateway.kv_events import (
    Batch,
    Cleared,
    KvEventError,
    KvEventIndex,
    Removed,
    Stored,
    parse_batch,
    unpack,
)
from pdfleet.gateway.prefix_index import prompt_blocks
from pdfleet.model.vllm_kv_events import FORMATS
from tests.unit.model.helpers import wheel_events


def _encoded(version: str) -> bytes:
    """A batch as the release's publisher encodes it: a store of two 4-token blocks, a removal, a clear."""
    c = wheel_events(version)
    stored: dict[str, Any] = {"block_hashes": [2**63 + 5, 7], "parent_block_hash": None}
    stored |= {"token_ids": [1, 2, 3, 4, 5, 6, 7, 8], "block_size": 4, "lora_id": None, "medium": "GPU"}
    if version == "0.33.0":
        stored |= {"lora_name": None, "group_idx": 0, "session_id": "s1"}
    removed = c["BlockRemoved"](block_hashes=[7], medium="GPU")
    events = [c["BlockStored"](**stored), removed, c["AllBlocksCleared"]()]
    return msgspec.msgpack.Encoder().encode(c["KVEventBatch"](ts=1.5, events=events, data_parallel_rank=0))


@pytest.mark.parametrize("version", sorted(FORMATS))
def test_a_batch_the_wheels_classes_encode_decodes_to_its_events(version: str) -> None:
    batch = parse_batch(_encoded(version), FORMATS[version])
    assert batch == Batch(
        1.5,
        [Stored([2**63 + 5, 7], None, [1, 2, 3, 4, 5, 6, 7, 8], 4), Removed([7]), Cleared()],
        0,
    )


def test_the_two_wire_forms_differ_as_tabled() -> None:
    """0.11.x events are arrays led by their tag; 0.33's are maps with a `type` key."""
    old, new = unpack(_encoded("0.11.2")), unpack(_encoded("0.33.0"))
    assert old[1][0][0] == "BlockStored" and old[1][2] == ["AllBlocksCleared"]
    assert new[1][0]["type"] == "BlockStored" and new[1][2] == {"type": "AllBlocksCleared"}
    assert "extra_keys" not in new[1][0]  # omit_defaults: a field at its default is left out


@pytest.mark.parametrize(
    "value",
    [None, True, False, 0, 127, 128, 255, 256, 65535, 65536, 2**32, 2**64 - 1, -1, -32, -33, -129]
    + [-(2**15) - 1, -(2**31) - 1, -(2**63), 1.5, -0.0, "", "x" * 31, "x" * 32, "é" * 300, "x" * 70_000]
    + [b"", b"\x00" * 300]
    + [[], list(range(16)), list(range(70_000)), {}, {str(i): i for i in range(16)}, {"a": [1, {"b": None}]}],
)
def test_unpack_reads_what_msgspec_writes(value: Any) -> None:
    assert unpack(msgspec.msgpack.encode(value)) == value


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"", "cut short"),
        (msgspec.msgpack.encode([1.0, [1, 2]])[:-1], "cut short"),
        (msgspec.msgpack.encode(1) + b"\x00", "bytes after"),
        (b"\xc1", "not used"),
        (msgspec.msgpack.encode({"ts": 1.0}), "not an EventBatch"),
        (msgspec.msgpack.encode([1.0, [[7, 1]]]), "not a tagged KV event"),
    ],
)
def test_a_malformed_payload_is_refused(payload: bytes, message: str) -> None:
    with pytest.raises(KvEventError, match=message):
        parse_batch(payload, FORMATS["0.33.0"])


def test_an_unknown_event_tag_is_skipped() -> None:
    payload = msgspec.msgpack.encode([1.0, [{"type": "BlockMoved"}, {"type": "AllBlocksCleared"}]])
    assert parse_batch(payload, FORMATS["0.33.0"]).events == [Cleared()]


def _stored(hashes: list[int], parent: int | None, ids: list[int], size: int = 4) -> Batch:
    return Batch(0.0, [Stored(list(hashes), parent, ids, size)])


def test_the_index_chains_token_ids_as_prompt_blocks_does() -> None:
    ids = list(range(100, 114))  # 14 tokens: three whole 4-token blocks
    blocks = prompt_blocks(ids, 4, 4.0)
    index = KvEventIndex(4)
    index.apply("a", _stored([11, 12], None, ids[:8]))
    assert index.cached_tokens("a", blocks, 14) == 8 and index.cached_tokens("b", blocks, 14) == 0
    index.apply("a", _stored([13], 12, ids[8:12]))  # the next block, under its parent's engine hash
    assert index.cached_tokens("a", blocks, 14) == 12
    index.apply("a", Batch(0.0, [Removed([12])]))  # the middle block evicted: the prefix stops before it
    assert index.cached_tokens("a", blocks, 14) == 4
    index.apply("a", _stored([99], 555, ids[4:8]))  # under a parent never seen stored: not chained
    assert index.cached_tokens("a", blocks, 14) == 4 and index.size("a") == 2
    index.record("a", blocks)  # the engine says what it holds: routing records nothing
    assert index.size("a") == 2
    index.apply("a", Batch(0.0, [Cleared()]))
    assert index.cached_tokens("a", blocks, 14) == 0 and index.size("a") == 0


def test_two_engine_hashes_of_one_token_chain_are_both_counted_until_both_are_removed() -> None:
    """Blocks with the same token ids and different extra keys (a LoRA, a cache salt) hash apart in the
    engine and alike in the index: one removal leaves the other held."""
    ids = [1, 2, 3, 4]
    index = KvEventIndex(4)
    index.apply("a", _stored([1], None, ids))
    index.apply("a", _stored([2], None, ids))
    index.apply("a", Batch(0.0, [Removed([1])]))
    assert index.cached_tokens("a", prompt_blocks(ids, 4, 4.0), 4) == 4
    index.apply("a", Batch(0.0, [Removed([2, 404])]))  # an unknown hash is ignored
    assert index.cached_tokens("a", prompt_blocks(ids, 4, 4.0), 4) == 0

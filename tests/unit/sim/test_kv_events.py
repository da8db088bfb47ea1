"""The simulator's KV events against the releases' own classes: its msgpack is msgspec's byte for byte,
a batch of its events is the batch the 0.11.2 and 0.33 wheels' classes encode from the same values, and
libzmq's SUB receives its messages as vLLM's publisher frames them (topic, sequence, batch), decoded by
the wheel's own typed decoder; --kv-events-config is read as the release reads it. End to end: a
simulator process publishing, the gateway's feed and index following it, the index's estimate of an
agent session's cached tokens against the simulator's own `vllm:prefix_cache_hits`."""

from __future__ import annotations

import asyncio
import json
import random
import urllib.request
from typing import Any

import msgspec
import pytest
import zmq

from pdfleet.bench.launch import SimProcess
from pdfleet.bench.procs import free_port
from pdfleet.errors import ValidationError
from pdfleet.gateway.kv_events import KvEventIndex
from pdfleet.gateway.kv_feed import FeedState, follow
from pdfleet.gateway.prefix_index import prompt_blocks
from pdfleet.metrics.scrape import scrape_metrics
from pdfleet.model.vllm_kv_events import FORMATS
from pdfleet.sim.kv_events import (
    END_SEQ,
    KvEventPublisher,
    KvEventsSettings,
    batch,
    external_hash,
    pack,
    parse_kv_events_config,
    removed,
    stored,
)
from tests.unit.model.helpers import wheel_events
from tests.unit.sim.helpers import MODEL

pytestmark = pytest.mark.procs  # the end-to-end test runs a simulator process

H1, H2, H3 = (bytes([i]) * 16 for i in (1, 2, 3))


@pytest.mark.parametrize(
    "value",
    [None, True, False, 0, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**64 - 1, -1, -32, -33]
    + [-128, -129, -(2**15), -(2**15) - 1, -(2**31) - 1, -(2**63), 1.5, "", "x" * 31, "x" * 32, "é" * 200]
    + ["x" * 70_000, b"", b"\x00" * 300, b"\x00" * 70_000, [], list(range(16)), list(range(70_000)), {}]
    + [{str(i): i for i in range(16)}, {"a": [1, {"b": None}]}],
)
def test_pack_is_msgspecs_msgpack(value: Any) -> None:
    assert pack(value) == msgspec.msgpack.encode(value)


def _wheel_batch(version: str) -> bytes:
    """What the release's block pool and publisher send for: blocks H1, H2 stored (H1's parent unknown:
    the first block), H3 under H2, H1 evicted."""
    c = wheel_events(version)
    common: dict[str, Any] = {"block_size": 4, "lora_id": None, "medium": "GPU"}
    first = {"block_hashes": [external_hash(H1), external_hash(H2)], "parent_block_hash": None}
    second = {"block_hashes": [external_hash(H3)], "parent_block_hash": external_hash(H2)}
    gone: dict[str, Any] = {"block_hashes": [external_hash(H1)], "medium": "GPU"}
    if version == "0.33.0":
        first |= {"lora_name": None, "extra_keys": [None, None], "group_idx": 0}
        second |= {"lora_name": None, "extra_keys": [None], "group_idx": 0}
        gone |= {"group_idx": 0}
    events = [
        c["BlockStored"](token_ids=list(range(8)), **first, **common),
        c["BlockStored"](token_ids=list(range(8, 12)), **second, **common),
        c["BlockRemoved"](**gone),
    ]
    return msgspec.msgpack.Encoder().encode(c["KVEventBatch"](ts=2.5, events=events, data_parallel_rank=0))


def _our_batch(version: str) -> bytes:
    fmt = FORMATS[version]
    events = [
        stored(fmt, [H1, H2], None, range(8), 4),
        stored(fmt, [H3], H2, range(8, 12), 4),
        removed(fmt, [H1]),
    ]
    return batch(events, 2.5)


@pytest.mark.parametrize("version", ["0.11.2", "0.33.0"])
def test_a_batch_is_the_bytes_the_wheels_classes_encode(version: str) -> None:
    assert _our_batch(version) == _wheel_batch(version)


def test_a_libzmq_sub_receives_batches_the_wheels_decoder_reads() -> None:
    c = wheel_events("0.33.0")
    decoder = msgspec.msgpack.Decoder(c["KVEventBatch"])

    async def scenario() -> None:
        pub = await KvEventPublisher.start(KvEventsSettings("127.0.0.1", 0, "kv"))
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"kv")
        sub.connect(f"tcp://127.0.0.1:{pub.pub.port}")
        try:
            while not any(pub.pub.peers.values()):
                await asyncio.sleep(0.01)
            pub.publish([])  # no events: no message, no sequence number used
            fmt = FORMATS["0.33.0"]
            pub.publish([stored(fmt, [H1], None, range(4), 4)], 1.0)
            pub.publish([removed(fmt, [H1])], 2.0)
            await asyncio.sleep(0)
            got = []
            for _ in range(2):
                assert await asyncio.get_running_loop().run_in_executor(None, lambda: sub.poll(5000))
                got.append(sub.recv_multipart())
            assert [(t, int.from_bytes(s, "big")) for t, s, _ in got] == [(b"kv", 0), (b"kv", 1)]
            first, second = (decoder.decode(p) for _, _, p in got)
            assert first.events[0].block_hashes == [external_hash(H1)]
            assert first.events[0].token_ids == [0, 1, 2, 3]
            assert first.data_parallel_rank == 0 and type(second.events[0]).__name__ == "BlockRemoved"
        finally:
            sub.close(linger=0)
            ctx.term()
            await pub.close()

    asyncio.run(scenario())


def test_the_replay_socket_serves_the_kept_batches_to_a_libzmq_dealer() -> None:
    """replay_endpoint's ROUTER as vLLM's `_service_replay`: libzmq's DEALER asks from a sequence number
    and gets every kept batch from it (the PUB's own bytes) and the -1 end marker; the oldest batch past
    buffer_steps is gone; a request of another shape gets nothing."""

    async def scenario() -> None:
        port = free_port()
        pub = await KvEventPublisher.start(
            KvEventsSettings("127.0.0.1", 0, "kv", replay=("127.0.0.1", port), buffer_steps=3)
        )
        fmt = FORMATS["0.33.0"]
        for i in range(4):  # batches 0-3; 0 falls out of a buffer of 3
            pub.publish([removed(fmt, [H1])], float(i))
        ctx = zmq.Context()
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(f"tcp://127.0.0.1:{port}")
        loop = asyncio.get_running_loop()

        def ask(frames: list[bytes]) -> list[list[bytes]]:
            dealer.send_multipart(frames)
            got = []
            while dealer.poll(3000 if not got else 500):
                got.append(dealer.recv_multipart())
                if got[-1][2:3] == [(-1).to_bytes(8, "big", signed=True)]:
                    break
            return got

        try:
            got = await loop.run_in_executor(None, ask, [b"", (0).to_bytes(8, "big")])
            assert [int.from_bytes(m[2], "big", signed=True) for m in got] == [1, 2, 3, -1]
            assert (
                got[0][:2] == [b"", b"kv"]
                and got[0][3] == pub.buffer[0][1]
                and got[-1] == [b"", b"", END_SEQ, b""]
            )
            later = await loop.run_in_executor(None, ask, [b"", (3).to_bytes(8, "big")])
            assert [int.from_bytes(m[2], "big", signed=True) for m in later] == [3, -1]
            assert await loop.run_in_executor(None, ask, [b"no delimiter"]) == []
        finally:
            dealer.close(linger=0)
            ctx.term()
            await pub.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("text", "version", "want"),
    [
        (None, "0.33.0", None),
        ('{"enable_kv_cache_events": false}', "0.33.0", None),
        ('{"enable_kv_cache_events": true}', "0.33.0", KvEventsSettings("", 5557, "")),
        ('{"enable_kv_cache_events": true}', "0.11.0", None),  # 0.11.0's publisher defaults to null
        ('{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://10.0.0.1:6000", '
         '"topic": "kv"}', "0.11.0", KvEventsSettings("10.0.0.1", 6000, "kv")),
        ('{"enable_kv_cache_events": true, "publisher": "null"}', "0.33.0", None),
        ('{"enable_kv_cache_events": true, "replay_endpoint": "tcp://*:5558", "buffer_steps": 50}', "0.33.0",
         KvEventsSettings("", 5557, "", ("", 5558), 50)),
    ],
)  # fmt: skip
def test_the_config_is_read_as_the_release_reads_it(text: str | None, version: str, want: Any) -> None:
    assert parse_kv_events_config(text, FORMATS[version]) == want


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not valid JSON"),
        ("[]", "must be a JSON object"),
        ('{"enable_kv_cache_events": true, "hwm2": 1}', "unknown field\\(s\\) hwm2"),
        ('{"enable_kv_cache_events": true, "publisher": "kafka"}', "publisher 'kafka'"),
        ('{"enable_kv_cache_events": true, "endpoint": "ipc:///tmp/kv"}', "binds tcp://HOST:PORT"),
        ('{"enable_kv_cache_events": true, "replay_endpoint": "tcp://x"}', "replay_endpoint 'tcp://x'"),
        ('{"enable_kv_cache_events": true, "buffer_steps": 0}', "buffer_steps 0"),
    ],
)
def test_a_bad_config_is_refused_naming_what(text: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        parse_kv_events_config(text, FORMATS["0.33.0"])


def _complete(url: str, ids: list[int]) -> None:
    body = json.dumps({"model": MODEL, "prompt": ids, "max_tokens": 2}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.status == 200


def test_the_index_fed_by_a_simulators_events_estimates_its_prefix_hits() -> None:
    """Three agent sessions of six turns each (token-id prompts growing 300-900 ids a turn from 1-3K),
    interleaved; before each request, the index's cached tokens for it; over the run, their sum against
    the simulator's `vllm:prefix_cache_hits` increase: within 10% (measured: within one block a request,
    vLLM never hitting a prompt's last token)."""
    port = free_port()
    config = json.dumps({"enable_kv_cache_events": True, "endpoint": f"tcp://127.0.0.1:{port}"})
    rng = random.Random(32)
    sessions = [[rng.randrange(1, 30_000) for _ in range(rng.randrange(1000, 3000))] for _ in range(3)]
    turns = [(s, rng.randrange(300, 900)) for _ in range(6) for s in range(3)]

    async def scenario(url: str) -> tuple[float, float]:
        index, state = KvEventIndex(16), FeedState()
        task = asyncio.create_task(
            follow("127.0.0.1", port, "sim", index, FORMATS["0.33.0"], state, retry_s=0.1)
        )
        loop = asyncio.get_running_loop()
        try:
            deadline = loop.time() + 60
            while state.batches == 0:  # the PUB drops what it sends before the subscription arrives
                assert loop.time() < deadline, ("no KV event batch within 60 s", state)
                # a new prompt each time: a repeated one hits the cache, stores no block, sends no event
                # (seen: under load the subscription came after the first probe's events, then nothing)
                probe = [rng.randrange(1, 30_000) for _ in range(64)]
                await loop.run_in_executor(None, _complete, url, probe)
                await asyncio.sleep(0.05)
            before = scrape_metrics(url).get("vllm:prefix_cache_hits_total", 0.0)
            estimate = 0
            for s, grow in turns:
                ids = sessions[s]
                estimate += index.cached_tokens("sim", prompt_blocks(ids, 16, 4.0), len(ids))
                await loop.run_in_executor(None, _complete, url, ids)
                blocks, whole = prompt_blocks(ids, 16, 4.0), len(ids) // 16 * 16
                deadline = loop.time() + 30  # its blocks' events, published at its prefill's steps
                while index.cached_tokens("sim", blocks, len(ids)) < whole:
                    assert loop.time() < deadline, ("its blocks' events did not arrive within 30 s", state)
                    await asyncio.sleep(0.01)
                ids += [rng.randrange(1, 30_000) for _ in range(grow)]
            return estimate, scrape_metrics(url).get("vllm:prefix_cache_hits_total", 0.0) - before
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    with SimProcess([MODEL, "--sim-time-scale", "0.05", "--kv-events-config", config]) as sim:
        estimate, hits = asyncio.run(scenario(sim.url))
    print(f"estimated cached tokens {estimate}, vllm:prefix_cache_hits increase {hits:.0f}")
    assert hits > 10_000 and abs(estimate - hits) <= 0.10 * hits

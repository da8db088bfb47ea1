"""The gateway's subscription to an engine's KV events, against libzmq's PUB (pyzmq) sending what vLLM's
ZmqEventPublisher sends (topic, 8-byte sequence number, a batch the 0.33 wheel's classes encode): the
blocks land in the index under the candidate; a skipped sequence number is a gap, after which the index
holds nothing of that engine until it stores again; an unreadable payload is counted and skipped; a
stopped publisher leaves nothing counted cached; after it restarts on the same port the feed reconnects;
with the engine's replay socket a gap is closed from it while its buffer holds the missed batches."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import msgspec
import zmq

from pdfleet.bench.procs import free_port
from pdfleet.gateway.kv_events import KvEventIndex
from pdfleet.gateway.kv_feed import FeedState, follow, seq_of, take
from pdfleet.gateway.prefix_index import prompt_blocks
from pdfleet.model.vllm_kv_events import FORMATS
from pdfleet.sim.kv_events import KvEventPublisher, KvEventsSettings, stored
from pdfleet.sim.kv_events import batch as sim_batch
from tests.unit.model.helpers import wheel_events

FMT = FORMATS["0.33.0"]
IDS = list(range(1000, 1032))  # two 16-token blocks


def _batch(c: dict[str, Any], *events: Any) -> bytes:
    return msgspec.msgpack.Encoder().encode(c["KVEventBatch"](ts=0.0, events=list(events)))


def _stored(c: dict[str, Any], hashes: list[int], parent: int | None, ids: list[int]) -> Any:
    return c["BlockStored"](
        block_hashes=hashes, parent_block_hash=parent, token_ids=ids, block_size=16, lora_id=None,
        medium="GPU", lora_name=None,
    )  # fmt: skip


async def _until(check: Any, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "not within the time"
        await asyncio.sleep(0.01)


def test_a_feed_applies_a_libzmq_publishers_batches_and_reconnects() -> None:
    c = wheel_events("0.33.0")
    blocks = prompt_blocks(IDS, 16, 4.0)

    async def scenario() -> None:
        ctx = zmq.Context()
        pub = ctx.socket(zmq.PUB)
        port = pub.bind_to_random_port("tcp://127.0.0.1")
        problems: list[str] = []
        index, state = KvEventIndex(16), FeedState(notify=problems.append)
        task = asyncio.create_task(follow("127.0.0.1", port, "colo1", index, FMT, state, retry_s=0.1))
        try:
            first = _batch(c, _stored(c, [11], None, IDS[:16]))
            seq = 0
            while state.batches == 0:  # the PUB drops what it sends before the subscription arrives
                pub.send_multipart([b"", seq.to_bytes(8, "big"), first])
                seq += 1
                await asyncio.sleep(0.02)
            assert index.cached_tokens("colo1", blocks, 32) == 16 and state.up
            # batches missed: a removal may be among them, so what the engine held is unknown, not cached
            pub.send_multipart([b"", (seq + 5).to_bytes(8, "big"), _batch(c, _stored(c, [12], 11, IDS[16:]))])
            await _until(lambda: state.gaps == 1)
            assert index.cached_tokens("colo1", blocks, 32) == 0 and problems == ["gap"]
            both = _batch(c, _stored(c, [11], None, IDS[:16]), _stored(c, [12], 11, IDS[16:]))
            pub.send_multipart([b"", (seq + 6).to_bytes(8, "big"), both])
            await _until(lambda: index.cached_tokens("colo1", blocks, 32) == 32)
            pub.send_multipart([b"", (seq + 7).to_bytes(8, "big"), b"\xc1"])
            await _until(lambda: state.bad == 1)
            pub.close(linger=0)  # the engine stops: its feed is down and the index holds nothing of it
            await _until(lambda: not state.up)
            assert index.cached_tokens("colo1", blocks, 32) == 0
            assert problems == ["gap", "unreadable", "disconnected"]
            pub = ctx.socket(zmq.PUB)  # it restarts on the same port
            for _ in range(500):  # libzmq releases the port in its own thread
                try:
                    pub.bind(f"tcp://127.0.0.1:{port}")
                    break
                except zmq.ZMQError:
                    await asyncio.sleep(0.01)
            seq = 0
            while index.cached_tokens("colo1", blocks, 32) != 16:
                pub.send_multipart([b"", seq.to_bytes(8, "big"), first])
                seq += 1
                await asyncio.sleep(0.02)
            assert state.connects == 2 and state.up
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            pub.close(linger=0)
            ctx.term()

    asyncio.run(scenario())


def test_a_message_that_is_not_three_frames_is_counted_bad() -> None:
    state, index = FeedState(), KvEventIndex(16)
    take(state, [b"", b"\x00" * 8], index, "a", FMT)
    take(state, [b"", b"\x00" * 7, b"\x90"], index, "a", FMT)
    assert state.bad == 2 and state.batches == 0
    assert seq_of((-1).to_bytes(8, "big", signed=True)) == -1  # the replay's end marker


def test_a_gap_is_closed_from_the_engine_s_replay_socket_when_it_still_holds_the_batches() -> None:
    """A simulator's publisher with its replay socket (vLLM's replay_endpoint): a batch the feed never got
    (dropped, as past a high-water mark) is asked for there and applied in order, so the chain of blocks
    under it stays counted and no gap is counted (a `gap_closed` is); once the engine's buffer no longer
    holds it (buffer_steps 1), the gap is counted and the engine forgotten, as without a replay socket."""
    ids = list(range(2000, 2048))  # three 16-token blocks, each stored in its own batch
    blocks = prompt_blocks(ids, 16, 4.0)
    fmt = FORMATS["0.33.0"]
    h = [bytes([i]) * 16 for i in range(1, 4)]

    async def scenario(buffer_steps: int) -> tuple[int, int, int, list[str]]:
        port = free_port()
        pub = await KvEventPublisher.start(
            KvEventsSettings("127.0.0.1", 0, "", replay=("127.0.0.1", port), buffer_steps=buffer_steps)
        )
        told: list[str] = []
        index, state = KvEventIndex(16), FeedState(notify=told.append)
        task = asyncio.create_task(
            follow("127.0.0.1", pub.pub.port, "colo1", index, fmt, state, replay=("127.0.0.1", port))
        )
        try:
            await _until(lambda: any(pub.pub.peers.values()))
            pub.publish([stored(fmt, h[:1], None, ids[:16], 16)])
            dropped = sim_batch([stored(fmt, h[1:2], h[0], ids[16:32], 16)])
            pub.buffer.append((pub.seq, dropped))  # kept for replay, never sent: a dropped message
            pub.seq += 1
            pub.publish([stored(fmt, h[2:], h[1], ids[32:], 16)])
            await _until(lambda: state.last_seq == 2)
            return state.replayed, state.gaps, index.cached_tokens("colo1", blocks, len(ids)), list(told)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await pub.close()

    # replayed 1, no gap, all three blocks counted, and the closed gap told (the gateway counts it)
    assert asyncio.run(scenario(10)) == (1, 0, 48, ["gap_closed"])
    assert asyncio.run(scenario(1)) == (0, 1, 0, ["gap"])  # the buffer kept only the last batch sent

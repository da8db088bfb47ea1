"""The gateway's subscription to one engine's KV-cache events (issue 32): a ZMQ SUB on the engine's
`--kv-events-config` endpoint, each batch applied in order to the `KvEventIndex` under the candidate
it describes.

A message is three frames: the topic, an 8-byte big-endian sequence number (0 from the publisher's
start) and the msgpack batch. A sequence number that is not the last one plus one means batches were
missed (the publisher's high-water mark, a reconnect, a restarted engine). With the engine's replay
socket (`replay_endpoint`, a ROUTER) the feed first asks it for the batches from the last one plus one,
as vLLM's own subscriber example does, and applies those it gets in order (`replayed`); a gap the
replay does not close (the engine's buffer no longer holds them, no replay socket, no answer within
`REPLAY_TIMEOUT_S`) is counted in `gaps`, and the index forgets what it held for that engine (a removal
missed could leave a block counted: unknown is never cached), as it does when a connection is made or
lost. A lost
connection is retried every `retry_s` until stopped; while it is down `up` is False and the engine
holds nothing the gateway counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from pdfleet.gateway.kv_events import KvEventError, KvEventIndex, parse_batch
from pdfleet.model.vllm_kv_events import EventFormat
from pdfleet.zmtp import Dealer, Subscriber, ZmtpError

log = logging.getLogger("pdfleet.gateway")
REPLAY_TIMEOUT_S = 2.0  # connecting to the replay socket, and each reply


@dataclass
class FeedState:
    """What one subscription has seen: batches applied, sequence gaps, bad payloads, connections made."""

    batches: int = 0
    gaps: int = 0
    bad: int = 0
    connects: int = 0
    drops: int = 0  # connections lost
    last_seq: int | None = None
    replayed: int = 0  # batches a gap's replay applied
    gaps_closed: int = 0  # gaps the replay closed (every missed batch applied, in order)
    up: bool = False  # connected now
    notify: Callable[[str], None] | None = None  # told each problem: gap, unreadable, disconnected

    def problem(self, kind: str) -> None:
        """Count one problem (and tell `notify`): `gap_closed` is a gap the replay socket made whole."""
        if kind == "gap":
            self.gaps += 1
        elif kind == "gap_closed":
            self.gaps_closed += 1
        elif kind == "unreadable":
            self.bad += 1
        else:
            self.drops += 1
        if self.notify is not None:
            self.notify(kind)


def seq_of(frame: bytes) -> int:
    """The publisher's sequence number (8 bytes, big-endian, signed: the replay's end marker is -1)."""
    return int.from_bytes(frame, "big", signed=True)


def take(state: FeedState, parts: list[bytes], index: KvEventIndex, candidate: str, fmt: EventFormat) -> None:
    """Apply one received message to the index, counting a gap before it or a payload it cannot read."""
    if len(parts) != 3 or len(parts[1]) != 8:
        state.problem("unreadable")
        return
    seq = seq_of(parts[1])
    if state.last_seq is not None and seq != state.last_seq + 1:
        state.problem("gap")
        index.forget(candidate)
    state.last_seq = seq
    try:
        batch = parse_batch(parts[2], fmt)
    except KvEventError as exc:
        state.problem("unreadable")
        log.warning("kv events from %s: batch %d unreadable: %s", candidate, seq, exc)
        return
    index.apply(candidate, batch)
    state.batches += 1


async def fill(
    replay: tuple[str, int],
    upto: int,
    state: FeedState,
    index: KvEventIndex,
    candidate: str,
    fmt: EventFormat,
) -> None:
    """Ask the replay socket for the batches after `state.last_seq` and apply, in order, those before
    `upto` (the message that showed the gap); a failure leaves the gap to `take`."""
    assert state.last_seq is not None
    dealer: Dealer | None = None
    try:
        dealer = await Dealer.connect(*replay, timeout_s=REPLAY_TIMEOUT_S)
        await dealer.send([b"", (state.last_seq + 1).to_bytes(8, "big")])
        while True:
            msg = await asyncio.wait_for(dealer.receive(), REPLAY_TIMEOUT_S)
            seq = seq_of(msg[2]) if len(msg) == 4 and len(msg[2]) == 8 else -1
            if seq < 0:
                return  # the end marker (or a reply of another shape)
            if state.last_seq + 1 == seq < upto:
                take(state, msg[1:], index, candidate, fmt)
                state.replayed += 1
    except (OSError, ZmtpError, asyncio.IncompleteReadError, TimeoutError) as exc:
        log.warning("kv events replay for %s (%s:%d): %s", candidate, *replay, exc)
    finally:
        if dealer is not None:
            with contextlib.suppress(Exception):
                await dealer.close()


def _gap(state: FeedState, parts: list[bytes]) -> int | None:
    """The sequence number of a message that follows a gap (None: no gap, or not a batch)."""
    if state.last_seq is None or len(parts) != 3 or len(parts[1]) != 8:
        return None
    seq = seq_of(parts[1])
    return seq if seq > state.last_seq + 1 else None


async def follow(
    host: str,
    port: int,
    candidate: str,
    index: KvEventIndex,
    fmt: EventFormat,
    state: FeedState,
    topic: bytes = b"",
    retry_s: float = 1.0,
    replay: tuple[str, int] | None = None,
) -> None:
    """Subscribe to one engine's events and apply them until cancelled, reconnecting after a failure."""
    while True:
        sub: Subscriber | None = None
        try:
            sub = await Subscriber.connect(host, port, topic)
            state.connects += 1
            state.last_seq = None  # a new connection: the publisher may have restarted
            index.forget(candidate)
            state.up = True
            while True:
                parts = await sub.receive()
                upto = _gap(state, parts) if replay is not None else None
                if upto is not None and replay is not None:
                    await fill(replay, upto, state, index, candidate, fmt)
                    if state.last_seq is not None and state.last_seq + 1 == upto:
                        state.problem("gap_closed")
                take(state, parts, index, candidate, fmt)
        except (OSError, ZmtpError, asyncio.IncompleteReadError, TimeoutError) as exc:
            log.warning("kv events from %s (%s:%d): %s; retrying in %gs", candidate, host, port, exc, retry_s)
        finally:
            if state.up:
                state.up = False
                state.problem("disconnected")
            index.forget(candidate)
            if sub is not None:
                with contextlib.suppress(Exception):
                    await sub.close()
        await asyncio.sleep(retry_s)

"""Discrete-event driver: runs engines (and P/D pairs) on a purely simulated clock, no sleeping.

Used by the calibration/interference tests and by anyone who wants "what would the GPU do" answers
in milliseconds of CPU time. The same `Engine` is driven in real time by `pdfleet.sim.runtime`.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pdfleet.model.catalog import LinkSpec
from pdfleet.sim.decode_run import decode_steps
from pdfleet.sim.engine import Batch, Engine, SimRequest
from pdfleet.sim.perf import LinkQueue

Callback = Callable[[SimRequest], None]


class Simulation:
    """An event queue over simulated seconds."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = itertools.count()

    def at(self, when: float, fn: Callable[..., None], *args: Any) -> None:
        """Run fn(*args) at simulated time `when` (never before now)."""
        heapq.heappush(self._heap, (max(when, self.now), next(self._seq), fn, args))

    def run(self, until: float = float("inf")) -> None:
        """Process events in time order until none are left or the next is after `until`."""
        while self._heap and self._heap[0][0] <= until:
            when, _, fn, args = heapq.heappop(self._heap)
            self.now = when
            fn(*args)


@dataclass
class Record:
    """What a client saw for one request: arrival and the time of every token."""

    request: SimRequest
    arrival: float
    token_times: list[float] = field(default_factory=list)

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.arrival

    @property
    def tpot(self) -> float:
        """vLLM bench's per-request TPOT: (last − first token) / (n − 1)."""
        n = len(self.token_times)
        return (self.token_times[-1] - self.token_times[0]) / (n - 1) if n > 1 else 0.0


class EngineNode:
    """One engine stepping back-to-back on the simulation's clock while it has work."""

    def __init__(
        self,
        sim: Simulation,
        engine: Engine,
        on_kv_load: Callable[[SimRequest], None] | None = None,
        keep_steps: bool = True,
    ) -> None:
        self.sim = sim
        self.engine = engine
        self.on_kv_load = on_kv_load
        self.keep_steps = keep_steps  # False: a long run (the planner's) does not keep every batch
        self.records: dict[str, Record] = {}
        self._callbacks: dict[str, tuple[Callback | None, Callback | None]] = {}
        self._busy = False
        self._ids = itertools.count()
        self.steps: list[Batch] = []

    def submit(
        self, req: SimRequest, on_token: Callback | None = None, on_finish: Callback | None = None
    ) -> Record:
        """Add a request now; returns the record its tokens will be written to."""
        rec = Record(req, self.sim.now)
        self.records[req.request_id] = rec
        self._callbacks[req.request_id] = (on_token, on_finish)
        self.engine.add(req, self.sim.now)
        self.kick()
        return rec

    def new_request(self, prompt: int, max_tokens: int, **kw: Any) -> SimRequest:
        """A request with a fresh id."""
        return SimRequest(f"req-{next(self._ids)}", prompt, max_tokens, **kw)

    def kick(self) -> None:
        """Start a step now if the engine is idle."""
        if not self._busy:
            self._busy = True
            self.sim.at(self.sim.now, self._step)

    def _step(self) -> None:
        """Schedule the next step at now and its completion after its duration; idle if nothing runs."""
        batch = self.engine.schedule(self.sim.now)
        for req in batch.kv_loads:
            if self.on_kv_load is None:
                raise RuntimeError("a remote-prefill request reached an engine without a KV source")
            self.on_kv_load(req)
        if not batch.entries:
            self._busy = False
            return
        if self.keep_steps:
            self.steps.append(batch)
        self.sim.at(self.sim.now + batch.duration, self._complete, batch)

    def _complete(self, batch: Batch) -> None:
        """Apply a finished step, record tokens, call back, and step again."""
        now = self.sim.now
        result = self.engine.complete(batch, now)
        for req in result.emitted:
            self.records[req.request_id].token_times.append(now)
            cb = self._callbacks[req.request_id][0]
            if cb:
                cb(req)
        for req in result.finished:
            cb = self._callbacks[req.request_id][1]
            if cb:
                cb(req)
        self._step()


class PDPair:
    """A producer and a consumer engine joined by a link: prefill on one, KV transfer, decode on the other."""

    def __init__(
        self, sim: Simulation, producer: Engine, consumer: Engine, link: LinkSpec, kv_bytes_per_token: int
    ) -> None:
        self.sim = sim
        self.link = LinkQueue(link)
        self.kv_bytes_per_token = kv_bytes_per_token
        self.producer = EngineNode(sim, producer)
        self.consumer = EngineNode(sim, consumer, on_kv_load=self._start_transfer)
        self.transfers: list[tuple[float, int]] = []  # (seconds, bytes)

    def submit(self, prompt: int, max_tokens: int, on_finish: Callback | None = None) -> Record:
        """Send a request through the pair; the returned record is the client's view (decode side)."""
        arrival = self.sim.now
        client = Record(SimRequest("pending", prompt, max_tokens), arrival)
        p_req = self.producer.new_request(prompt, 1, remote_decode=True)

        def prefilled(req: SimRequest) -> None:
            params = {"remote_request_id": req.request_id, "remote_block_ids": list(req.block_ids)}
            d_req = self.consumer.new_request(prompt, max_tokens, remote_prefill=params)
            rec = self.consumer.submit(d_req, on_finish=on_finish)
            rec.arrival = arrival
            client.request = d_req
            rec.token_times = client.token_times  # one list: the client sees the decode side's tokens

        self.producer.submit(p_req, on_finish=prefilled)
        return client

    def _start_transfer(self, req: SimRequest) -> None:
        """Move the request's KV over the pair's link (queued behind earlier transfers)."""
        nbytes = req.prompt_tokens * self.kv_bytes_per_token
        end = self.link.reserve(self.sim.now, nbytes)
        self.transfers.append((end - self.sim.now, nbytes))
        params = req.remote_prefill or {}
        self.sim.at(end, self._transfer_done, req.request_id, params.get("remote_request_id"))

    def _transfer_done(self, request_id: str, remote_id: str | None) -> None:
        """The KV arrived: free the producer's held blocks and let the consumer decode."""
        if remote_id is not None:
            self.producer.engine.release_held(remote_id)
            self.producer.kick()  # freed blocks may admit a waiting prefill
        self.consumer.engine.kv_loaded(request_id, ok=True)
        self.consumer.kick()


class PDPool:
    """x producers and y consumers behind a round-robin router (vllm-router's round_robin on each side):
    prefill on the next producer, the KV over the chosen consumer's own link (transfers to one consumer
    queue on it), decode on that consumer. `transfers` holds (consumer, seconds, bytes) per request."""

    def __init__(
        self,
        sim: Simulation,
        producers: list[Engine],
        consumers: list[Engine],
        link: LinkSpec,
        kv_bytes_per_token: int,
    ) -> None:
        self.sim = sim
        self.kv_bytes_per_token = kv_bytes_per_token
        self.producers = [EngineNode(sim, e, keep_steps=False) for e in producers]
        self.consumers = [
            EngineNode(sim, e, on_kv_load=self._transfer_for(i), keep_steps=False)
            for i, e in enumerate(consumers)
        ]
        self.links = [LinkQueue(link) for _ in consumers]
        self.transfers: list[tuple[int, float, int]] = []
        # (consumer, its request id) -> the producer holding the blocks and its request id there
        self._held: dict[tuple[int, str], tuple[EngineNode, str]] = {}
        self._rr = itertools.count()

    def submit(self, prompt: int, max_tokens: int, on_finish: Callback | None = None) -> PDRecord:
        """Send a request through the pool; its record gets the decode side's tokens and both queues."""
        turn = next(self._rr)
        producer = self.producers[turn % len(self.producers)]
        consumer = self.consumers[turn % len(self.consumers)]
        client = PDRecord(SimRequest("pending", prompt, max_tokens), self.sim.now)
        p_req = producer.new_request(prompt, 1, remote_decode=True)
        client.prefill = p_req

        def prefilled(req: SimRequest) -> None:
            params = {"remote_request_id": req.request_id, "remote_block_ids": list(req.block_ids)}
            d_req = consumer.new_request(prompt, max_tokens, remote_prefill=params)
            self._held[(turn % len(self.consumers), d_req.request_id)] = (producer, req.request_id)
            rec = consumer.submit(d_req, on_finish=on_finish)
            rec.arrival = client.arrival
            client.request = d_req
            rec.token_times = client.token_times

        producer.submit(p_req, on_finish=prefilled)
        return client

    def _transfer_for(self, index: int) -> Callable[[SimRequest], None]:
        """The KV-load callback of consumer `index`: queue the transfer on that consumer's link."""

        def start(req: SimRequest) -> None:
            nbytes = req.prompt_tokens * self.kv_bytes_per_token
            end = self.links[index].reserve(self.sim.now, nbytes)
            self.transfers.append((index, end - self.sim.now, nbytes))
            self.sim.at(end, self._transfer_done, index, req.request_id)

        return start

    def _transfer_done(self, index: int, request_id: str) -> None:
        """The KV arrived: the producer frees its held blocks, the consumer decodes."""
        producer, held_id = self._held.pop((index, request_id))
        producer.engine.release_held(held_id)
        producer.kick()  # freed blocks may admit a waiting prefill
        self.consumers[index].engine.kv_loaded(request_id, ok=True)
        self.consumers[index].kick()


@dataclass
class PDRecord(Record):
    """A P/D request as the client sees it, plus its prefill-side request (for the prefill queue)."""

    prefill: SimRequest | None = None


def run_alone(engine: Engine, arrivals: Sequence[tuple[float, int, int]]) -> list[Record]:
    """One engine whose requests are all known in advance (arrival s, prompt, max tokens; sorted): the
    same steps `EngineNode` takes on the event queue, in a loop of its own, decode-only stretches in one
    call (`sim.decode_run`). For an instance nothing else touches (a colocated one: the gateway's
    round robin decides its requests up front), so a planner can run thousands of steps per millisecond.
    """
    records: list[Record] = []
    i, n, t = 0, len(arrivals), 0.0
    while True:
        while i < n and arrivals[i][0] <= t:
            at, prompt, max_tokens = arrivals[i]
            req = SimRequest(f"req-{i}", prompt, max_tokens)
            rec = Record(req, at)
            req.sink = rec
            engine.add(req, at)
            records.append(rec)
            i += 1
        next_at = arrivals[i][0] if i < n else float("inf")
        ends = decode_steps(engine, t, next_at)
        if ends:
            for req in engine.running:
                req.sink.token_times.extend(ends)
            t = ends[-1]
            continue
        batch = engine.schedule(t)
        if not batch.entries:
            if i >= n:
                return records
            t = max(t, next_at)
            continue
        t += batch.duration
        for req in engine.complete(batch, t).emitted:
            req.sink.token_times.append(t)


def closed_loop(
    node: EngineNode,
    concurrency: int,
    prompt: int,
    output: int,
    requests_per_client: int,
    stagger: float = 0.0,
) -> list[Record]:
    """vLLM-bench-style clients: each sends its next request when the previous finishes.

    Client i starts at i × stagger, so a steady state with evenly phased streams can be studied
    (a deterministic model never desynchronises streams that start together).
    """
    records: list[Record] = []

    def start(left: int) -> None:
        if left == 0:
            return
        req = node.new_request(prompt, output)
        records.append(node.submit(req, on_finish=lambda _r: start(left - 1)))

    for i in range(concurrency):
        node.sim.at(node.sim.now + i * stagger, start, requests_per_client)
    return records

"""The simulated engine: vLLM V1-style scheduling on an injected clock, no I/O, no real time.

The caller owns time. `schedule(now)` picks the next step's batch like vLLM's scheduler (running first,
one token per decode, prefill chunks within `max_num_batched_tokens`, new requests while `max_num_seqs`
and free KV blocks allow, recompute preemption from the running list's tail when blocks run out) and
returns the step's duration from the `PerfModel`; the caller waits it (really, scaled, or in a DES) and
calls `complete(batch, end)`, which returns the requests that produced a token and those that finished.

P/D: a `remote_decode` request (producer) is prefilled only, its blocks *held* until `release_held` or
expiry. A `remote_prefill` request (consumer) takes its own prefix-cache hit, is admitted with blocks
for its whole prompt and listed in `Batch.kv_loads`; the caller moves the rest and calls `kv_loaded`,
then it computes its last prompt token (as vLLM's NixlConnector does) and decodes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from pdfleet.model.catalog import DEFAULT_BLOCK_SIZE
from pdfleet.sim.blocks import BlockPool
from pdfleet.sim.perf import PerfModel
from pdfleet.sim.prompt_stats import PromptTokens

# How long a producer holds finished blocks for its consumer: VLLM_NIXL_ABORT_REQUEST_TIMEOUT's default
# since PR #25897 [VLLM-PD §2.1], in simulated seconds.
DEFAULT_HOLD_TIMEOUT_S = 480.0


class State(Enum):
    """Where a request is in the engine."""

    WAITING = "waiting"
    LOADING_KV = "loading_kv"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False, slots=True)
class SimRequest:
    """One request inside the engine: its size, P/D role, progress and timestamps (simulated seconds)."""

    request_id: str
    prompt_tokens: int
    max_tokens: int
    remote_decode: bool = False
    remote_prefill: dict[str, Any] | None = None
    sink: Any = None  # the driver's handle (e.g. the HTTP stream); the engine never touches it
    computed: int = 0
    generated: int = 0
    block_ids: list[int] = field(default_factory=list)
    state: State = State.WAITING
    arrival: float = 0.0
    first_scheduled: float | None = None
    first_token: float | None = None
    prev_token: float | None = None  # time of the token before the latest one (for inter-token gaps)
    last_token: float | None = None
    finish_reason: str | None = None
    num_preemptions: int = 0
    kv_id: str = ""  # what the producer holds the blocks under for the consumer (default: request_id)
    cached: tuple[int, int] = (0, 0)  # prompt tokens from the local prefix cache, from a KV transfer
    block_hashes: tuple[bytes, ...] = ()  # the prompt's full blocks, chained (pdfleet.sim.blocks)


@dataclass(slots=True)
class Batch:
    """One scheduled step: (request, new tokens) pairs, KV loads to start, and the step's duration."""

    start: float
    entries: list[tuple[SimRequest, int]]
    kv_loads: list[SimRequest]
    duration: float
    tokens: int


@dataclass(slots=True)
class StepResult:
    """What a completed step produced: requests with a new token, and requests that finished."""

    emitted: list[SimRequest]
    finished: list[SimRequest]


@dataclass(frozen=True)
class EngineLimits:
    """The scheduler's knobs, as vLLM's `vllm serve` options set them."""

    num_blocks: int
    block_size: int = DEFAULT_BLOCK_SIZE
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    hold_timeout_s: float = DEFAULT_HOLD_TIMEOUT_S
    recompute_on_load_failure: bool = False
    enable_prefix_caching: bool = False
    prefix_stats_skip_preempted: bool = False  # 0.33: a preempted request's lookups are not counted


class Engine:
    """Continuous-batching scheduler and KV block manager over simulated time."""

    def __init__(self, perf: PerfModel, limits: EngineLimits) -> None:
        self.perf = perf
        self.limits = limits
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.loading: dict[str, SimRequest] = {}
        self.held: dict[str, tuple[SimRequest, float]] = {}
        self._held_order: deque[str] = deque()
        self.pool = BlockPool(limits.num_blocks, limits.enable_prefix_caching)
        self.prefix_cache_queries = 0  # tokens looked up in the prefix cache, as vLLM counts them
        self.prefix_cache_hits = 0  # of those, tokens found cached
        self.num_preemptions = 0
        self.prompt = PromptTokens()  # vllm:prompt_tokens and its 0.33 split by source
        self.generation_tokens = 0

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def kv_usage(self) -> float:
        """Fraction of KV blocks in use (held producer blocks included), like vllm:kv_cache_usage_perc."""
        total = self.limits.num_blocks
        return (total - self.pool.num_free) / total if total else 0.0

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        """Waiting requests, including those waiting for their remote KV (vLLM counts them as waiting)."""
        return len(self.waiting) + len(self.loading)

    def has_work(self) -> bool:
        """True when a step could run now (something running, or waiting that may be admitted)."""
        return bool(self.running or self.waiting)

    def add(self, req: SimRequest, now: float) -> None:
        """Queue a new request (arrival at `now`)."""
        req.arrival = now
        req.state = State.WAITING
        self.waiting.append(req)

    def abort(self, request_id: str) -> SimRequest | None:
        """Drop a request wherever it is (client went away) and free its blocks."""
        for req in self.waiting:
            if req.request_id == request_id:
                self.waiting.remove(req)
                return self._drop(req)
        for req in self.running:
            if req.request_id == request_id:
                self.running.remove(req)
                return self._drop(req)
        loading = self.loading.pop(request_id, None)
        return self._drop(loading) if loading is not None else None

    def _drop(self, req: SimRequest) -> SimRequest:
        self._free_blocks(req)
        req.state = State.FINISHED
        req.finish_reason = "abort"
        return req

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.limits.block_size)

    def _allocate(self, req: SimRequest, tokens: int) -> bool:
        """Grow req's blocks to cover `tokens` KV entries; False (nothing taken) if not enough are free."""
        need = self._blocks_for(tokens) - len(req.block_ids)
        if need <= 0:
            return True
        blocks = self.pool.take(need)
        if blocks is None:
            return False
        req.block_ids.extend(blocks)
        return True

    def _free_blocks(self, req: SimRequest) -> None:
        self.pool.free(req.block_ids)
        req.block_ids = []

    def _prefix_hit(self, req: SimRequest) -> int:
        """vLLM's get_computed_blocks for a request that starts (again): the cached blocks its prompt
        begins with, never its last token (recomputed for the logits); returns the tokens looked up."""
        num_tokens = req.prompt_tokens + req.generated
        if not self.limits.enable_prefix_caching or req.computed or req.block_ids:
            return 0
        bs = self.limits.block_size
        req.block_ids = self.pool.match(req.block_hashes, (num_tokens - 1) // bs)
        req.computed = len(req.block_ids) * bs
        return num_tokens

    def _unmatch(self, req: SimRequest, queried: int) -> None:
        """Not admitted: let go of the cached blocks a lookup took; it looks up again next time."""
        if queried:
            self._free_blocks(req)
            req.computed = 0

    def _count_prefix(self, req: SimRequest, queried: int) -> None:
        """Add an admitted request's lookup to vllm:prefix_cache_queries/hits (in tokens)."""
        if not req.num_preemptions:  # the first admission's hit is what vLLM's PrefillStats records
            req.cached = (req.computed, req.cached[1])
        if queried and not (req.num_preemptions and self.limits.prefix_stats_skip_preempted):
            self.prefix_cache_queries += queried
            self.prefix_cache_hits += req.computed

    def _preempt(self, req: SimRequest) -> None:
        """Recompute preemption: drop the KV, put the request back at the head of the queue."""
        self._free_blocks(req)
        req.computed = 0
        req.state = State.WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def _chunk(self, req: SimRequest, budget: int) -> int:
        """Tokens to compute for req this step within the budget (0 = cannot be scheduled now)."""
        remaining = req.prompt_tokens + req.generated - req.computed
        n = min(remaining, budget)
        thr = self.limits.long_prefill_token_threshold
        if thr > 0 and remaining > 1:
            n = min(n, thr)
        if n < remaining and not self.limits.enable_chunked_prefill:
            return 0
        return n

    def schedule(self, now: float) -> Batch:
        """Choose the next step's batch at time `now` (may be empty: nothing runnable)."""
        budget = self.limits.max_num_batched_tokens
        entries: list[tuple[SimRequest, int]] = []
        kv_loads: list[SimRequest] = []
        preempted = False
        i = 0
        running = self.running
        bs = self.limits.block_size
        while i < len(running) and budget > 0:
            req = running[i]
            ctx = req.computed
            if req.prompt_tokens + req.generated - ctx == 1 and len(req.block_ids) * bs > ctx:
                # decode fast path: one token, its KV slot already allocated
                entries.append((req, 1))
                budget -= 1
                i += 1
                continue
            n = self._chunk(req, budget)
            if n == 0:
                i += 1
                continue
            while not self._allocate(req, req.computed + n):
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
            if req.state is not State.RUNNING:
                break
            entries.append((req, n))
            budget -= n
            i += 1
        if not preempted:
            budget = self._admit(now, budget, entries, kv_loads)
        return self._batch(now, entries, kv_loads)

    def _admit(
        self, now: float, budget: int, entries: list[tuple[SimRequest, int]], kv_loads: list[SimRequest]
    ) -> int:
        """Move waiting requests into the batch (or into KV loading) while limits allow."""
        waiting = self.waiting
        while waiting and len(self.running) + len(self.loading) < self.limits.max_num_seqs:
            req = waiting[0]
            if req.remote_prefill is not None:
                queried = self._prefix_hit(req)  # its own hit first: the connector pulls the rest only
                if not self._allocate(req, req.prompt_tokens):
                    self._unmatch(req, queried)
                    break
                self._count_prefix(req, queried)
                waiting.popleft()
                req.state = State.LOADING_KV
                if req.first_scheduled is None:
                    req.first_scheduled = now
                self.loading[req.request_id] = req
                kv_loads.append(req)
                continue
            if budget <= 0:
                break
            queried = self._prefix_hit(req)
            n = self._chunk(req, budget)
            if n == 0 or not self._allocate(req, req.computed + n):
                self._unmatch(req, queried)
                break
            self._count_prefix(req, queried)
            waiting.popleft()
            req.state = State.RUNNING
            if req.first_scheduled is None:
                req.first_scheduled = now
            self.running.append(req)
            entries.append((req, n))
            budget -= n
        return budget

    def _batch(self, now: float, entries: list[tuple[SimRequest, int]], kv_loads: list[SimRequest]) -> Batch:
        """The Batch for these entries, with its step time from the roofline model."""
        tokens = 0
        attn = 0.0
        kv = 0
        sampled = 0
        for req, n in entries:
            ctx = req.computed
            tokens += n
            attn += n * ctx + n * n * 0.5
            kv += ctx + n
            if ctx + n == req.prompt_tokens + req.generated:
                sampled += 1
        duration = self.perf.step_time(tokens, attn, kv, sampled) if entries else 0.0
        return Batch(now, entries, kv_loads, duration, tokens)

    def complete(self, batch: Batch, end: float) -> StepResult:
        """Apply a finished step at time `end`: advance requests, emit tokens, finish and free."""
        emitted: list[SimRequest] = []
        finished: list[SimRequest] = []
        for req, n in batch.entries:
            if req.state is not State.RUNNING:
                continue  # aborted while the step ran
            before = req.computed
            req.computed = before + n
            total = req.prompt_tokens + req.generated
            if before < req.prompt_tokens and req.block_hashes:  # full prompt blocks become cached
                full = min(len(req.block_hashes), req.computed // self.limits.block_size)
                self.pool.cache(req.block_ids, req.block_hashes, full)
            if req.computed == total:
                req.generated += 1
                if req.first_token is None:
                    req.first_token = end
                    self.prompt.first_token(req.prompt_tokens, *req.cached)
                req.prev_token = req.last_token
                req.last_token = end
                emitted.append(req)
                if req.generated >= req.max_tokens:
                    finished.append(req)
        self.generation_tokens += len(emitted)
        if finished:
            for req in finished:
                self._finish(req, end)
            self.running = [r for r in self.running if r.state is State.RUNNING]
        return StepResult(emitted, finished)

    def _finish(self, req: SimRequest, end: float) -> None:
        """A request reached max_tokens: free its blocks, or hold them for the consumer (producer side)."""
        req.state = State.FINISHED
        req.finish_reason = "length"  # the engine has no EOS; the server maps its simulated EOS to "stop"
        if req.remote_decode:
            key = req.kv_id or req.request_id
            self.held[key] = (req, end + self.limits.hold_timeout_s)
            self._held_order.append(key)
        else:
            self._free_blocks(req)

    # ---- P/D -----------------------------------------------------------------------------------
    def kv_loaded(self, request_id: str, ok: bool) -> SimRequest | None:
        """The remote KV for a loading request arrived (ok) or could not be read.

        Returns the request if it failed for good (policy "fail"): the caller reports the error.
        """
        req = self.loading.pop(request_id, None)
        if req is None:
            return None
        req.remote_prefill = None  # the remote copy is consumed; a later preemption recomputes locally
        if ok:
            local = req.cached[0]  # its own prefix-cache hit, which was not pulled
            req.computed = req.prompt_tokens - 1
            req.cached = (local, req.computed - local)  # counted in vllm:prompt_tokens at its first token
        elif self.limits.recompute_on_load_failure:
            req.computed = req.cached[0]  # from the first block it failed to load: its own hit stays
        else:
            self._free_blocks(req)
            req.state = State.FINISHED
            req.finish_reason = "error"
            return req
        req.state = State.RUNNING
        self.running.append(req)
        return None

    def held_request(self, request_id: str) -> SimRequest | None:
        """The finished producer request whose blocks are still held, if any."""
        entry = self.held.get(request_id)
        return entry[0] if entry else None

    def held_until(self, request_id: str) -> float | None:
        """When a held request's blocks expire (simulated seconds), None if not held."""
        entry = self.held.get(request_id)
        return entry[1] if entry else None

    def extend_held(self, request_id: str, until: float) -> bool:
        """A consumer's heartbeat: keep the held blocks at least until `until` (False if not held)."""
        entry = self.held.get(request_id)
        if entry is None:
            return False
        if until > entry[1]:
            self.held[request_id] = (entry[0], until)
            self._held_order.remove(request_id)  # keep the order sorted by expiry for expire_held
            held = self.held
            later = (i for i, rid in enumerate(self._held_order) if rid in held and held[rid][1] > until)
            index = next(later, len(self._held_order))
            self._held_order.insert(index, request_id)
        return True

    def release_held(self, request_id: str) -> SimRequest | None:
        """The consumer has read the blocks: free them."""
        entry = self.held.pop(request_id, None)
        if entry is None:
            return None
        self._free_blocks(entry[0])
        return entry[0]

    def expire_held(self, now: float) -> list[SimRequest]:
        """Free held blocks whose lease ran out (nobody pulled them); returns those requests."""
        expired = []
        order = self._held_order
        while order:
            rid = order[0]
            entry = self.held.get(rid)
            if entry is None:
                order.popleft()
                continue
            if entry[1] > now:
                break
            order.popleft()
            del self.held[rid]
            self._free_blocks(entry[0])
            expired.append(entry[0])
        return expired

    def next_expiry(self) -> float | None:
        """When the oldest held lease runs out (for the driver's timer)."""
        for rid in self._held_order:
            entry = self.held.get(rid)
            if entry is not None:
                return entry[1]
        return None

    def iter_active(self) -> Iterable[SimRequest]:
        """Every request the engine still tracks (for shutdown)."""
        yield from self.waiting
        yield from self.running
        yield from self.loading.values()

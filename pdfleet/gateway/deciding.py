"""The gateway's side of the decider: it gathers one request's facts (prefix index, queues, outstanding
prompt tokens), asks the pure decision (decider.py), and records where the prompt went.

One `Deciding` lives as long as the gateway, across policy reloads, so a reload keeps what the index
learned; `configure` applies a policy's `decider:` settings (a changed block size or bound starts the
index afresh) and the P/D instances to scrape.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from pdfleet.gateway.decider import Facts, Load, decide
from pdfleet.gateway.kv_feeds import Count, KvFeeds, wanted_of
from pdfleet.gateway.load import Outstanding, QueueWatch
from pdfleet.gateway.policy import ActivePolicy, Decision, LengthClass, Pool, Route, bucket_of, length_class
from pdfleet.gateway.prefix_index import CacheSource, PrefixIndex, prompt_blocks, prompt_text
from pdfleet.gateway.prompt_ids import EnginePrompt
from pdfleet.model.routing import ColocatedChoice, DeciderSpec, ThresholdOn

_NO_LOADS: tuple[Load, ...] = ()


class Deciding:
    """The decider's live state: the prefix index, the P/D queues, the colocated outstanding tokens."""

    def __init__(self, policy: ActivePolicy, count: Count | None = None) -> None:
        self.index: PrefixIndex | None = None
        # the colocated instances' KV events, for the routes that list them (`count`: each feed problem)
        self.feeds = KvFeeds(count)
        # the prefix index of the requests that asked for prefix_load (or for effective) while the policy
        # keeps none: only
        # they read and feed it, so a client that does not ask costs nothing more (a reload drops it)
        self.asked: PrefixIndex | None = None
        self.queues = QueueWatch()
        self.outstanding = Outstanding()
        self.spec = DeciderSpec()
        self.shadowing = False  # a shadow run with a queue bound: scrape every P/D instance listed too
        self._poller: asyncio.Task[None] | None = None
        self.configure(policy)

    def configure(self, policy: ActivePolicy) -> None:
        """Apply a (new) policy's settings and the instances it names."""
        spec = policy.spec.decider
        self.asked = None
        if not spec.uses_index:
            self.index = None
        elif self.index is None or (self.index.capacity, self.index.block_tokens) != (
            spec.index_blocks,
            spec.block_tokens,
        ):
            self.index = PrefixIndex(spec.index_blocks, spec.block_tokens)
        scraped: list[str] = []
        shadow = self.shadowing and policy.spec.shadow.pd_waiting_max is not None
        for route in policy.routes.values():
            if shadow or (spec.polls and spec.prefill_busy_waiting is not None):
                scraped += route.prefill
            if shadow or (spec.polls and spec.decode_busy_waiting is not None):
                scraped += route.decode
        self.queues.watch(scraped)
        self.feeds.configure(wanted_of(policy.routes.values()), spec.block_tokens)
        self.spec = spec

    def start(self) -> None:
        """Start scraping the P/D instances (a no-op loop while none is watched)."""
        if self._poller is None:
            self._poller = asyncio.get_running_loop().create_task(self.queues.run(lambda: self.spec.poll_s))
        self.feeds.start()

    async def stop(self) -> None:
        """Stop scraping."""
        await self.feeds.stop()
        task, self._poller = self._poller, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _index(
        self, spec: DeciderSpec, route: Route, choice: ColocatedChoice | None, on: ThresholdOn | None
    ) -> CacheSource | None:
        """The cache facts this request reads (and feeds): the KV events when its route lists them, else
        the policy's prefix index when it keeps one, else (a request that asked for prefix_load or
        effective) the asking requests' own index, made on the first such request."""
        asked = choice == "prefix_load" or on == "effective"
        if route.kv_events and route.colocated and self.feeds.follows(route.colocated[0]):
            return self.feeds if spec.reads_cache or asked else None
        if spec.uses_index:
            return self.index
        if not asked:
            return None
        if self.asked is None:
            self.asked = PrefixIndex(spec.index_blocks, spec.block_tokens)
        return self.asked

    def _pd_cached(self, index: CacheSource, route: Route, blocks: list[int], tokens: int) -> int:
        """The P/D candidate's cached tokens of a prompt: from its prefill instances' KV events when the
        route lists them (the largest when the router picks by prefix, else their mean: it spreads
        prompts), else what the index recorded for the router."""
        assert route.disagg is not None
        if index is not self.feeds or not route.prefill_kv_events:
            return index.cached_tokens(route.disagg, blocks, tokens)
        each = [self.feeds.cached_tokens(u, blocks, tokens) for u in route.prefill]
        return max(each) if route.prefill_cache_aware else sum(each) // len(each)

    def route(
        self,
        policy: ActivePolicy,
        route: Route,
        data: dict[str, Any],
        endpoint: str,
        tokens: int,
        sticky: str,
        forced: Pool | None,
        choice: ColocatedChoice | None = None,
        on: ThresholdOn | None = None,
        ids: EnginePrompt | None = None,
    ) -> tuple[LengthClass, Decision]:
        """The request's length class and decision; its prompt recorded on the chosen candidate.
        `choice`, `on`: the colocated choice and threshold_on the request asked for (None: the policy's);
        `ids`: the prompt's blocks of the engine's ids, when the route renders them (else its text is cut)."""
        bucket = bucket_of(sticky)
        staging = route.staging
        if staging is None:  # an outside alias: no stage, no pools
            return length_class(tokens, policy.spec.long_prompt_tokens), Decision(
                "outside", "outside", bucket
            )
        spec = policy.spec.decider
        urls = route.colocated
        index = self._index(spec, route, choice, on)
        blocks: list[int] | None = None
        if index is not None:
            if ids is not None:  # cut in the intake's worker thread
                blocks = ids.blocks
            else:
                text = prompt_text(data, endpoint)
                blocks = prompt_blocks(text, spec.block_tokens, policy.spec.estimator.chars_per_token)
            cached = [index.cached_tokens(u, blocks, tokens) for u in urls]
        else:
            cached = [0] * len(urls)
        busy = (choice or spec.colocated_choice) == "prefix_load"
        outstanding = self.outstanding.of(urls) if busy else [0] * len(urls)
        serving = self.outstanding.serving(urls) if busy else ()
        prefill = decode = _NO_LOADS
        if spec.polls:
            now = time.monotonic()
            if spec.prefill_busy_waiting is not None:
                prefill = tuple(self.queues.load(u, now) for u in route.prefill)
            if spec.decode_busy_waiting is not None:
                decode = tuple(self.queues.load(u, now) for u in route.decode)
        facts = Facts(
            tokens,
            bucket,
            cached,
            outstanding,
            route.next_rr(),
            route.disagg is not None,
            endpoint in route.disagg_endpoints,
            forced,
            prefill,
            decode,
            choice,
            on,
            serving,
        )
        v = decide(spec, staging.weights, staging.long_prompt_tokens, facts)
        decision = Decision(v.pool, v.reason, bucket, v.instance, v.effective)
        if index is not None and blocks is not None:  # the estimate for where it went, then the record
            disagg = route.disagg if v.pool == "disagg" else None
            where = decision.candidate = disagg or urls[v.instance]
            decision.cached = self._pd_cached(index, route, blocks, tokens) if disagg else cached[v.instance]
            if blocks:
                index.record(where, blocks)
        return v.cls, decision

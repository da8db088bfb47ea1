"""The gateway's KV-events subscriptions (issue 32): one feed per colocated instance a policy route lists
under `kv_events:` and per P/D prefill instance under `prefill_kv_events:`, all into one `KvEventIndex`
keyed by the instance's base URL, so the decider reads them through the same `cached_tokens` as the
gateway's own prefix index.

A feed that is not connected (the engine stopped, its publisher unreachable) counts nothing cached for
its instance: the index forgets an instance when its feed connects, loses its connection or misses
batches (kv_feed.py), and `cached` answers 0 while the feed is down, never the last state. A policy
reload keeps the feeds whose endpoint, release and block size are unchanged, starts new ones and stops
those no longer listed. Each problem is counted through `count(instance URL, kind)`: `gap` (batches
missed), `gap_closed` (missed, then replayed whole), `unreadable` (a payload it could not parse) and
`disconnected` (a connection lost), as they happen.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from pdfleet.gateway.kv_events import KvEventIndex
from pdfleet.gateway.kv_feed import FeedState, follow
from pdfleet.gateway.policy import Route
from pdfleet.model.vllm_kv_events import EventFormat, event_format

PROBLEMS = ("gap", "unreadable", "disconnected")
Count = Callable[[str, str], None]


@dataclass(frozen=True)
class Wanted:
    """One subscription: the instance's base URL, its publisher and the release's event format."""

    candidate: str
    host: str
    port: int
    fmt: EventFormat
    replay: tuple[str, int] | None = None  # its replay socket (ROUTER), when the route lists one


@dataclass
class _Feed:
    wanted: Wanted
    state: FeedState
    task: asyncio.Task[None] | None = None


def wanted_of(routes: Iterable[Route]) -> dict[str, Wanted]:
    """Every route's colocated and prefill instances paired with their publishers (a route without
    kv_events: none)."""
    out: dict[str, Wanted] = {}
    for route in routes:
        fmt = event_format(route.kv_events_release or "")
        if fmt is None:
            continue
        replays = dict(zip(route.colocated, route.kv_events_replay, strict=False))
        replays |= dict(zip(route.prefill, route.prefill_kv_events_replay, strict=False))
        pairs = [*zip(route.colocated, route.kv_events, strict=False)]
        pairs += zip(route.prefill, route.prefill_kv_events, strict=False)
        for url, endpoint in pairs:
            replay = replays.get(url)
            out[url] = Wanted(url, *_host_port(endpoint), fmt, None if replay is None else _host_port(replay))
    return out


def _host_port(endpoint: str) -> tuple[str, int]:
    """tcp://HOST:PORT's host and port."""
    host, _, port = endpoint.partition("://")[2].rpartition(":")
    return host.strip("[]"), int(port)


class KvFeeds:
    """The live subscriptions and the index they fill (see the module docstring)."""

    def __init__(self, count: Count | None = None) -> None:
        self.index = KvEventIndex(16)
        self._feeds: dict[str, _Feed] = {}
        self._count = count or (lambda _candidate, _kind: None)
        self._running = False

    def configure(self, wanted: dict[str, Wanted], block_tokens: int) -> None:
        """Follow exactly these publishers (a changed block size starts the index afresh)."""
        if block_tokens != self.index.block_tokens:
            self.index = KvEventIndex(block_tokens)
            for feed in list(self._feeds.values()):
                self._stop(feed)
            self._feeds.clear()
        for candidate in list(self._feeds):
            if self._feeds[candidate].wanted != wanted.get(candidate):
                self._stop(self._feeds.pop(candidate))
        for candidate, want in wanted.items():
            if candidate not in self._feeds:
                self._feeds[candidate] = _Feed(want, FeedState(notify=self._notifier(candidate)))
        if self._running:
            self.start()

    def _notifier(self, candidate: str) -> Callable[[str], None]:
        return lambda kind: self._count(candidate, kind)

    def start(self) -> None:
        """Start every feed not running (in the gateway's event loop)."""
        self._running = True
        for feed in self._feeds.values():
            if feed.task is None:
                w = feed.wanted
                feed.task = asyncio.get_running_loop().create_task(
                    follow(w.host, w.port, w.candidate, self.index, w.fmt, feed.state, replay=w.replay)
                )

    def _stop(self, feed: _Feed) -> None:
        feed.state.notify = None  # a feed stopped is not a connection lost
        if feed.task is not None:
            feed.task.cancel()
            feed.task = None
        self.index.forget(feed.wanted.candidate)

    async def stop(self) -> None:
        """Stop every feed."""
        self._running = False
        tasks = [f.task for f in self._feeds.values() if f.task is not None]
        for feed in self._feeds.values():
            self._stop(feed)
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def follows(self, candidate: str) -> bool:
        """A feed is listed for this instance (its cache facts come from KV events)."""
        return candidate in self._feeds

    def cached_tokens(self, candidate: str, blocks: Sequence[int], tokens: int) -> int:
        """The instance's cached tokens of the prompt; 0 while its feed is down (unknown, never cached)."""
        feed = self._feeds.get(candidate)
        if feed is None or not feed.state.up:
            return 0
        return self.index.cached_tokens(candidate, blocks, tokens)

    def record(self, candidate: str, blocks: Sequence[int]) -> None:
        """Nothing: the engines' events say what they cached."""

    def states(self) -> dict[str, FeedState]:
        """Each followed instance's feed state."""
        return {c: f.state for c, f in self._feeds.items()}

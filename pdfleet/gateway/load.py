"""The live load facts the decider reads: the P/D pool's queues (scraped) and the colocated instances'
outstanding prompt tokens (counted by the gateway itself).

Queues: every `poll_s` the gateway GETs each prefill and decode instance's `/metrics` and keeps
`vllm:num_requests_waiting` (summed over its engines) with the time it was read. A failed scrape (a
stopped instance, a timeout, no such series) clears the figure at once, so it reads as unknown, never as
idle. The pinned vLLM release (0.33) exports no gauge of queued prompt tokens (its metrics table in
pdfleet.model.vllm_release_data has none), so the bound is on waiting requests only.

Outstanding prompt tokens: what the gateway sent to a colocated instance and has not seen a first byte
for yet (the instance is still prefilling it), charged with the tokens the decider expects it to
prefill; and the requests each colocated instance is serving (those prefilling, and the streams it
is decoding: first byte sent, not yet ended), each of which a fresh prefill there would stall.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

import aiohttp

from pdfleet.gateway.decider import Load

log = logging.getLogger("pdfleet.gateway")

WAITING = "vllm:num_requests_waiting"


def parse_waiting(text: str) -> int | None:
    """`vllm:num_requests_waiting` summed over its samples (one per engine); None when absent."""
    total: float | None = None
    for line in text.splitlines():
        if not line.startswith(WAITING):
            continue
        rest = line[len(WAITING) :]
        if rest[:1] not in ("{", " "):
            continue  # another series sharing the prefix (num_requests_waiting_by_reason)
        if rest.startswith("{"):
            rest = rest.rpartition("}")[2]  # label values may hold spaces
        try:
            value = float(rest.split()[0])  # a sample may end with a timestamp
        except (ValueError, IndexError):
            continue
        total = value if total is None else total + value
    return None if total is None else int(total)


class QueueWatch:
    """The last `vllm:num_requests_waiting` of each watched instance and when it was read."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[int, float]] = {}
        self.urls: tuple[str, ...] = ()

    def watch(self, urls: Iterable[str]) -> None:
        """Scrape these base URLs from now on (a reload may change them)."""
        self.urls = tuple(dict.fromkeys(urls))
        for gone in set(self._seen) - set(self.urls):
            del self._seen[gone]

    def load(self, url: str, now: float | None = None) -> Load:
        """The instance's figure and its age (unknown if never read or the last read failed)."""
        seen = self._seen.get(url)
        if seen is None:
            return Load(None, None)
        t = time.monotonic() if now is None else now
        return Load(seen[0], t - seen[1])

    def saw(self, url: str, waiting: int | None, at: float) -> None:
        """A scrape's outcome: a figure, or None (failed: unknown from now on)."""
        if waiting is None:
            self._seen.pop(url, None)
        else:
            self._seen[url] = (waiting, at)

    async def scrape(self, session: aiohttp.ClientSession, url: str, timeout_s: float) -> None:
        """Read one instance's queue."""
        try:
            async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                text = await resp.text() if resp.status == 200 else ""
        except (aiohttp.ClientError, TimeoutError, OSError):
            text = ""
        self.saw(url, parse_waiting(text), time.monotonic())

    async def run(self, poll_s: Callable[[], float]) -> None:
        """Scrape every watched instance every `poll_s()` seconds (the active policy's) until cancelled;
        a scrape gets at most one period."""
        async with aiohttp.ClientSession() as session:
            while True:
                started = time.monotonic()
                period = poll_s()
                urls = self.urls
                if urls:
                    await asyncio.gather(*(self.scrape(session, u, period) for u in urls))
                await asyncio.sleep(max(0.05, period - (time.monotonic() - started)))


class Outstanding:
    """Per colocated instance: prompt tokens sent and not yet answered with a first byte (and how many
    requests carry them), and the streams it is decoding (a first byte, not yet ended)."""

    def __init__(self) -> None:
        self.tokens: dict[str, int] = {}
        self.prefilling: dict[str, int] = {}
        self.streams: dict[str, int] = {}

    def add(self, url: str, tokens: int) -> None:
        self.tokens[url] = self.tokens.get(url, 0) + tokens
        self.prefilling[url] = self.prefilling.get(url, 0) + 1

    def done(self, url: str, tokens: int) -> None:
        _take(self.tokens, url, tokens)
        _take(self.prefilling, url, 1)

    def of(self, urls: Iterable[str]) -> list[int]:
        return [self.tokens.get(u, 0) for u in urls]

    def stream(self, url: str) -> None:
        """A stream started decoding on the instance."""
        self.streams[url] = self.streams.get(url, 0) + 1

    def ended(self, url: str) -> None:
        """A stream on the instance ended (finished, failed or its client left)."""
        _take(self.streams, url, 1)

    def serving(self, urls: Iterable[str]) -> list[int]:
        """Requests each instance is prefilling or decoding: each decodes beside a prefill sent there now."""
        return [self.prefilling.get(u, 0) + self.streams.get(u, 0) for u in urls]


def _take(counts: dict[str, int], url: str, n: int) -> None:
    left = counts.get(url, 0) - n
    if left > 0:
        counts[url] = left
    else:
        counts.pop(url, None)


class LongPrefills:
    """The long prompts each colocated instance is prefilling now (sent by this gateway, no first byte
    yet), how many it was sent in all and when its last one ended: enough to tell whether a stream on
    that instance decoded, or stalled, beside a long prefill (issue 33), at O(1) per stream and per stall.

    Times are perf_counter() seconds, the proxy's clock for chunk gaps."""

    __slots__ = ("active", "started", "last_end")

    def __init__(self) -> None:
        self.active: dict[str, int] = {}
        self.started: dict[str, int] = {}
        self.last_end: dict[str, float] = {}

    def start(self, url: str) -> None:
        self.active[url] = self.active.get(url, 0) + 1
        self.started[url] = self.started.get(url, 0) + 1

    def end(self, url: str, now: float) -> None:
        left = self.active.get(url, 0) - 1
        if left > 0:
            self.active[url] = left
        else:
            self.active.pop(url, None)
        self.last_end[url] = now

    def mark(self, url: str) -> tuple[bool, int]:
        """At a stream's first byte: whether a long prefill is running on its instance, and the count of
        long prompts sent there so far (a later one started during the stream)."""
        return url in self.active, self.started.get(url, 0)

    def overlapped(self, url: str, mark: tuple[bool, int]) -> bool:
        """At a stream's end: whether a long prefill ran on its instance while it decoded."""
        return mark[0] or self.started.get(url, 0) > mark[1]

    def during(self, url: str, since: float) -> bool:
        """Whether a long prefill ran on the instance at some point after `since` (a stall's start)."""
        return url in self.active or self.last_end.get(url, 0.0) > since

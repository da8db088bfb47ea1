"""Server figures over a run window through a real DirectScrape of /metrics pages: the chain per role in ms,
preemptions, peak KV usage sampled, and a missing series kept as its reason, never a zero."""

from __future__ import annotations

import asyncio

from pdfleet.bench.server_side import NO_KV_HISTOGRAM, chain, kv_peak, reasons, value_of
from pdfleet.metrics.direct import DirectScrape, Target
from tests.unit.bench.helpers import text_server

LE = ("0.3", "0.5", "0.8", "1.0", "+Inf")


def page(queued: int, kv: float, preempted: int) -> str:
    """A vLLM-like exposition: `queued` requests waited 0.3-0.5 s; KV usage; preemptions; 1000 prompt tokens
    looked up in the prefix cache per request, a quarter of them found."""
    lines = [
        f'vllm:request_queue_time_seconds_bucket{{le="{le}"}} {0 if le == "0.3" else queued}' for le in LE
    ]
    lines += [
        f"vllm:request_queue_time_seconds_count {queued}",
        f"vllm:request_queue_time_seconds_sum {0.4 * queued}",
    ]
    lines += [f"vllm:kv_cache_usage_perc {kv}", f"vllm:num_preemptions_total {preempted}"]
    lines += [
        f"vllm:prefix_cache_queries_total {1000 * queued}",
        f"vllm:prefix_cache_hits_total {250 * queued}",
    ]
    return "\n".join(lines) + "\n"


def test_chain_per_role_over_the_window_and_reasons_for_what_is_missing() -> None:
    clock = [0.0]
    pages = {"/metrics": page(0, 0.1, 0)}
    with text_server(pages) as url:
        source = DirectScrape(
            [Target(url + "/metrics", {"pool": "colocated", "role": "colocated", "host": "c1"})],
            clock=lambda: clock[0],
        )
        source.scrape()
        pages["/metrics"] = page(10, 0.6, 3)
        clock[0] = 30.0
        figs = chain(source, "colocated", 30.0, None)
    q95 = figs["queue_p95_ms"]["colocated"]
    assert isinstance(q95, float) and 300 < q95 <= 500  # inside the 0.3-0.5 s bucket, in ms
    assert figs["preemptions"] == {"colocated": 3.0}
    assert figs["prefix_cache_hit_pct"] == {"colocated": 25.0}  # 2500 of the 10000 tokens looked up
    assert "kv_transfer_p95_ms" not in figs  # a colocated pool has no KV connector
    assert str(figs["prefill_p95_ms"]["*"]).startswith("n/a: ")  # not exported: a reason, not 0
    assert value_of(figs["prefill_p95_ms"]) is None and value_of(figs["queue_p95_ms"], "colocated") == q95


def test_kv_peak_keeps_the_highest_sample_until_stopped() -> None:
    pages = {"/metrics": page(0, 0.2, 0)}
    with text_server(pages) as url:
        source = DirectScrape([Target(url + "/metrics", {"pool": "disagg", "role": "decode", "host": "d1"})])

        async def main() -> dict[str, float]:
            stop = asyncio.Event()
            task = asyncio.create_task(kv_peak(source, "disagg", stop, every_s=0.05))
            await asyncio.sleep(0.2)
            pages["/metrics"] = page(0, 0.9, 0)
            await asyncio.sleep(0.2)
            pages["/metrics"] = page(0, 0.3, 0)
            await asyncio.sleep(0.2)
            stop.set()
            return await task

        assert asyncio.run(main()) == {"decode": 0.9}


def test_prefix_hit_rate_with_no_lookup_in_the_window_is_a_reason_not_a_zero() -> None:
    clock = [0.0]
    with text_server({"/metrics": page(4, 0.1, 0)}) as url:
        source = DirectScrape(
            [Target(url + "/metrics", {"pool": "colocated", "role": "colocated", "host": "c1"})],
            clock=lambda: clock[0],
        )
        source.scrape()
        clock[0] = 30.0
        figs = chain(source, "colocated", 30.0, None)
    assert figs["prefix_cache_hit_pct"] == {"colocated": "n/a: no prompt token looked up in the window"}


def test_the_decider_reasons_over_the_window_or_why_there_are_none() -> None:
    """The gateway's decisions per reason grew by 40 and 10 in the window; a source without the gateway's
    series gives its reason, never an empty mix."""
    clock = [0.0]
    line = 'pdfleet_gateway_decisions_total{{model="llama",reason="{}"}} {}'
    pages = {"/metrics": "\n".join([line.format("stage_weight", 5), line.format("short", 100)]) + "\n"}
    with text_server(pages) as url:
        source = DirectScrape(
            [Target(url + "/metrics", {"role": "gateway", "host": "gw"})], clock=lambda: clock[0]
        )
        source.scrape()
        pages["/metrics"] = (
            "\n".join(
                [line.format("stage_weight", 45), line.format("short", 110), line.format("fallback", 0)]
            )
            + "\n"
        )
        clock[0] = 30.0
        assert reasons(source, 30.0) == {"stage_weight": 40.0, "short": 10.0, "fallback": 0.0}
        pages["/metrics"] = page(1, 0.1, 0)
        clock[0] = 60.0
        assert str(reasons(source, 30.0)).startswith("n/a: ")


def test_the_kv_transfer_tail_is_read_from_the_histogram_named_for_the_connector() -> None:
    """Issue 25: a Mooncake P/D pool's KV transfer comes from vllm:mooncake_xfer_time_seconds on its prefill
    instance (Mooncake pushes from P), not NIXL's, which a Mooncake fleet never exports (was n/a); with no
    histogram for the connector (0.11.0's NIXL) the figure is that reason, never a zero."""
    clock = [0.0]

    def kv_page(transfers: int) -> str:
        name = "vllm:mooncake_xfer_time_seconds"
        lines = [
            f'{name}_bucket{{le="{le}"}} {0 if le == "0.01" else transfers}'
            for le in ("0.01", "0.025", "+Inf")
        ]
        return "\n".join([*lines, f"{name}_count {transfers}", f"{name}_sum {0.02 * transfers}"]) + "\n"

    pages = {"/metrics": kv_page(0)}
    with text_server(pages) as url:
        source = DirectScrape(
            [Target(url + "/metrics", {"pool": "disagg", "role": "prefill", "host": "p1"})],
            clock=lambda: clock[0],
        )
        source.scrape()
        pages["/metrics"] = kv_page(20)
        clock[0] = 30.0
        mooncake = chain(source, "disagg", 30.0, "vllm:mooncake_xfer_time_seconds")
        nixl = chain(source, "disagg", 30.0, "vllm:nixl_xfer_time_seconds")
        none = chain(source, "disagg", 30.0, None)
    p95 = mooncake["kv_transfer_p95_ms"]["prefill"]
    assert isinstance(p95, float) and 10 < p95 <= 25  # inside the 10-25 ms bucket
    assert str(nixl["kv_transfer_p95_ms"]["*"]).startswith("n/a: ")
    assert none["kv_transfer_p95_ms"] == none["kv_transfer_p99_ms"] == {"*": NO_KV_HISTOGRAM}

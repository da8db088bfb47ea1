"""shadow.report's figures from a real gateway's shadow series (read through a DirectScrape of its
/metrics): rows per class, bin and side, the long-prefill counts, and the bench's verdict with what it
cannot read kept as n/a, never as a zero."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from pdfleet.bench.shadow_report import COLUMNS, as_dict, build_report, table_rows
from pdfleet.bench.verdict import Thresholds
from pdfleet.metrics.direct import DirectScrape, Target
from tests.unit.gateway.helpers import ADMIN_KEY, LONG, Env, auth, chat, run

BOUNDS = Thresholds(ttft_p95_ms=2000, tpot_p95_ms=100, prefill_queue_p95_ms=500, decode_queue_p95_ms=500)
START = {"action": "start", "stage": "long-all", "share": 100, "minutes": 5}


def test_the_report_compares_both_sides_of_the_shadowed_requests(tmp_path: Path) -> None:
    async def scenario() -> None:
        # a gap counts as a stall past 30 s here, not the default 500 ms: the unit phase runs niced beside
        # the lab, where a 10 ms chunk once arrived over 500 ms late (CI, stop 47: 25 stalls per 100)
        async with Env(tmp_path, delay=0.01, stage="off", stall_threshold_ms=30_000) as env:
            clock = [0.0]
            source = DirectScrape([Target(env.base + "/metrics", {})], clock=lambda: clock[0])
            await asyncio.to_thread(source.scrape)
            data = json.dumps(START).encode()
            async with env.session.post(env.base + "/admin/shadow", data=data, headers=auth(ADMIN_KEY)) as r:
                assert r.status == 200
            for _ in range(4):
                st, _, _ = await env.post("/v1/chat/completions", chat(LONG, stream=True, max_tokens=4))
                assert st == 200
            for _ in range(50):
                if not env.gw.gateway.shadowing.status()["in_flight"]:  # type: ignore[union-attr]
                    break
                await asyncio.sleep(0.05)
            clock[0] = 60.0
            report = await asyncio.to_thread(build_report, source, 60.0, BOUNDS)
        rows = {r["side"]: r for r in report.rows}
        assert set(rows) == {"primary", "shadow"}
        for side in rows.values():
            assert (side["class"], side["bin"], side["requests"], side["errors"]) == ("long", "0-2k", 4, 0)
            assert side["ttft_p95_ms"] is not None and 0 < side["ttft_p95_ms"] < 2000
            assert side["stalls_per_100"] == 0
        assert [len(r) for r in table_rows(report)] == [len(COLUMNS)] * 2
        # no vLLM behind the fake pools: TPOT and queues are unknown, so the verdict says undecided
        assert report.figures["colocated"].ttft_p95_ms is not None
        assert report.figures["colocated"].tpot_p95_ms is None
        assert report.verdict is not None and report.verdict.decision == "undecided"
        assert json.loads(json.dumps(as_dict(report), default=str))["verdict"]["decision"] == "undecided"

    run(scenario())


def test_gaps_over_the_threshold_are_stalls_on_both_sides_and_the_report_counts_them(tmp_path: Path) -> None:
    """Chunks 250 ms apart against a 40 ms threshold: each side's stream stalls (a side could read none only
    if the gateway fell over 200 ms behind on every chunk of all three requests)."""

    async def scenario() -> None:
        async with Env(tmp_path, delay=0.25, stage="off", stall_threshold_ms=40) as env:
            clock = [0.0]
            source = DirectScrape([Target(env.base + "/metrics", {})], clock=lambda: clock[0])
            await asyncio.to_thread(source.scrape)
            data = json.dumps(START).encode()
            async with env.session.post(env.base + "/admin/shadow", data=data, headers=auth(ADMIN_KEY)) as r:
                assert r.status == 200
            for _ in range(3):
                st, _, _ = await env.post("/v1/chat/completions", chat(LONG, stream=True, max_tokens=2))
                assert st == 200
            for _ in range(50):
                if not env.gw.gateway.shadowing.status()["in_flight"]:  # type: ignore[union-attr]
                    break
                await asyncio.sleep(0.05)
            for shadowed in ("false", "true"):
                assert await env.metric("pdfleet_gateway_shadow_stream_stalls_total", shadow=shadowed) >= 1
            clock[0] = 60.0
            report = await asyncio.to_thread(build_report, source, 60.0, BOUNDS)
        rows = {r["side"]: r for r in report.rows}
        assert set(rows) == {"primary", "shadow"}
        for side in rows.values():
            assert side["requests"] == 3
            # at most one stall a chunk: two data chunks and [DONE] a request
            assert 0 < side["stalls_per_100"] <= 300

    run(scenario())


def test_no_shadowed_request_is_said_so(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Env(tmp_path, stage="off") as env:
            clock = [0.0]
            source = DirectScrape([Target(env.base + "/metrics", {})], clock=lambda: clock[0])
            await asyncio.to_thread(source.scrape)
            clock[0] = 60.0
            report = await asyncio.to_thread(build_report, source, 60.0, BOUNDS)
        assert report.rows == [] and report.long_prefill == {}
        assert any("no shadowed request in the window" in n for n in report.notes)

    run(scenario())

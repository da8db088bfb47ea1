"""P/D: the KV connector directly, then two simulator processes speaking the kv_transfer_params protocol
over the side channel, and the real vllm-router (PyPI `vllm-router`) driving them end to end."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest

from pdfleet.bench.launch import RouterProcess, SimProcess
from pdfleet.bench.procs import free_port
from pdfleet.metrics.scrape import scrape_metrics
from pdfleet.sim.clock import SimClock
from pdfleet.sim.config import parse_serve_args
from pdfleet.sim.engine import SimRequest, State
from pdfleet.sim.kv_transfer import KVConnector, missing
from pdfleet.sim.metrics import SimMetrics
from pdfleet.sim.side_channel import PullError, ReadGrant, SideChannelServer, pull
from pdfleet.sim.stream import Sink
from tests.unit.sim.helpers import MODEL, kv_config, post_json, wait_for

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py

KV_BYTES_8B = 131072


# ---- the connector, in process ----------------------------------------------------------------------


def _connector(role: str, *args: str, **extra: Any) -> tuple[KVConnector, list[None]]:
    """A KVConnector for `role` over a fresh engine; the list collects its wake-ups."""
    cfg = parse_serve_args([MODEL, *args, "--kv-transfer-config", kv_config(role, **extra)], env={})
    assert cfg.kv_transfer is not None
    woken: list[None] = []
    engine = cfg.engine()
    metrics = SimMetrics(cfg.max_model_len, pd=True)
    clock = SimClock(0.001)
    return KVConnector(cfg, cfg.kv_transfer, engine, metrics, clock, lambda: woken.append(None)), woken


FULL = {
    "do_remote_prefill": True,
    "remote_block_ids": [[1]],
    "remote_engine_id": "e",
    "remote_host": "h",
    "remote_port": 1,
    "remote_request_id": "r",
}


def _held(kv: KVConnector, rid: str, prompt: int, now: float = 0.0) -> SimRequest:
    """Prefill a remote-decode request on the producer's engine until its blocks are held."""
    req = SimRequest(rid, prompt, 1, remote_decode=True)
    kv.engine.add(req, now)
    kv.engine.complete(kv.engine.schedule(now), now + 0.1)
    assert req.state is State.FINISHED and kv.engine.held_request(rid) is req
    return req


@pytest.mark.parametrize(
    ("role", "params", "expected"),
    [
        ("kv_producer", {"do_remote_decode": True}, (True, None)),
        ("kv_producer", {"do_remote_prefill": True}, (False, None)),
        ("kv_consumer", FULL, (False, FULL)),
        ("kv_consumer", {**FULL, "remote_request_id": None} | {"remote_block_ids": []}, (False, None)),
        ("kv_consumer", {k: v for k, v in FULL.items() if k != "remote_request_id"}, (False, None)),
        ("kv_consumer", {"do_remote_decode": True}, (False, None)),
        ("kv_both", {"do_remote_decode": True}, (True, None)),
        ("kv_producer", "not-an-object", (False, None)),
    ],
)
def test_kv_transfer_params_decide_the_requests_role_here(role: str, params: Any, expected: Any) -> None:
    kv, _ = _connector(role)
    assert kv.role_of({"kv_transfer_params": params}) == expected


def test_a_producer_returns_what_the_consumer_needs_to_read() -> None:
    """0.33: the release's produced keys in its order, block ids one list per KV-cache group."""
    kv, _ = _connector("kv_producer")
    req = _held(kv, "cmpl-1", 100)
    out = kv.params_out(req, "length")
    assert out is not None and list(out) == list(kv.cfg.release.kv_transfer_params.produced)
    assert out["remote_block_ids"] == [req.block_ids] and len(req.block_ids) == 7
    assert out["remote_engine_id"] == kv.kv.engine_id and out["remote_request_id"] == "cmpl-1"
    assert (out["remote_host"], out["remote_port"], out["tp_size"]) == ("localhost", 5600, 1)
    assert (out["remote_num_tokens"], out["transfer_mode"]) == (100, "pull")
    assert kv.params_out(SimRequest("plain", 10, 1), "length") is None
    stopped = _held(kv, "cmpl-2", 100)
    assert kv.params_out(stopped, "stop") is not None  # 0.33 hands blocks over for stopped requests too


def test_a_0_11_producer_returns_its_release_s_keys_only_for_length_capped_finishes() -> None:
    """0.11: flat block ids, no remote_request_id; a stopped request's blocks are freed, not handed over."""
    kv, woken = _connector("kv_producer", "--sim-vllm-version", "0.11.0")
    req = _held(kv, "cmpl-1", 100)
    out = kv.params_out(req, "length")
    assert out == {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": req.block_ids,
        "remote_engine_id": kv.kv.engine_id,
        "remote_host": "localhost",
        "remote_port": 5557,
        "tp_size": 1,
    }
    stopped = _held(kv, "cmpl-2", 100)
    assert kv.params_out(stopped, "stop") is None
    assert kv.engine.held_request("cmpl-2") is None and woken == [None]
    assert kv.pairs_by_request_id() and not _connector("kv_consumer")[0].pairs_by_request_id()


def test_a_0_33_lease_is_renewed_by_heartbeats_a_0_11_timeout_is_not() -> None:
    """0.33: a heartbeat extends the hold by kv_lease_duration * 2 // 3; 0.11 holds 120 s, no renewal."""
    kv, _ = _connector("kv_producer")
    assert kv.cfg.abort_timeout_s == 30.0
    _held(kv, "cmpl-1", 100)
    kv.clock.start(asyncio.new_event_loop())
    assert kv.renew("cmpl-1") and kv.engine.held_until("cmpl-1") == pytest.approx(30.1)
    assert not kv.renew("gone")
    old, _ = _connector("kv_producer", "--sim-vllm-version", "0.11.0")
    assert old.cfg.abort_timeout_s == 120.0 and not old.renew("cmpl-1")


def test_grants_and_release_of_held_blocks() -> None:
    kv, woken = _connector("kv_producer")
    _held(kv, "cmpl-1", 100)
    assert kv.grant("cmpl-1") == ReadGrant(100, 7, 100 * KV_BYTES_8B)
    assert kv.grant("other") is None
    kv.release("other")
    assert woken == []
    kv.release("cmpl-1")
    assert woken == [None] and kv.grant("cmpl-1") is None
    assert kv.engine.num_free_blocks == kv.cfg.num_blocks


def test_leases_expire_with_vllms_warning(caplog: pytest.LogCaptureFixture) -> None:
    kv, _ = _connector("kv_producer", kv_connector_extra_config={"kv_lease_duration": 30})
    _held(kv, "cmpl-1", 100)
    assert kv.engine.held_until("cmpl-1") == pytest.approx(30.1)
    kv.expire_leases(29.0)
    assert kv.metrics.nixl_expired == 0
    with caplog.at_level(logging.WARNING, logger="pdfleet.sim"):
        kv.expire_leases(31.0)
    assert kv.metrics.nixl_expired == 1
    assert (
        "Releasing expired KV blocks for request cmpl-1 which were retrieved by 0 decode worker(s) "
        "within 30 seconds." in caplog.text
    )


async def _producer(kv: KVConnector, grant: ReadGrant, done: Any) -> tuple[SideChannelServer, dict[str, Any]]:
    """A producer's side channel on loopback answering every read with `grant` (`done`: its release
    callback), and the kv_transfer_params a consumer's request carries to read from it."""
    side = SideChannelServer("engine-p", kv.compat, lambda rid: grant, done)
    await side.start("127.0.0.1", 0)
    assert side._server is not None
    port = side._server.sockets[0].getsockname()[1]
    return side, {"remote_host": "127.0.0.1", "remote_port": port, "remote_request_id": "p"}


def test_a_consumer_loads_over_the_side_channel_then_logs_it(caplog: pytest.LogCaptureFixture) -> None:
    kv, woken = _connector("kv_consumer", "--sim-link", "roce-400g")
    released: list[str] = []

    async def run() -> SimRequest:
        kv.clock.start(asyncio.get_running_loop())
        grant = ReadGrant(500, 32, 500 * KV_BYTES_8B)
        side, params = await _producer(kv, grant, released.append)
        req = SimRequest("d", 500, 3, remote_prefill=params)
        kv.engine.add(req, 0.0)
        assert kv.engine.schedule(0.0).kv_loads == [req]
        try:
            await kv.load(req)
        finally:
            await side.close()
        return req

    req = asyncio.run(run())
    m = kv.metrics
    assert released == ["p"] and woken == [None] and req.state is not State.FINISHED
    assert (m.nixl_bytes.n, m.nixl_bytes.total, m.nixl_failed_transfers) == (1, 500 * KV_BYTES_8B, 0)
    assert m.nixl_xfer.total == pytest.approx(kv.cfg.link.transfer_time(500 * KV_BYTES_8B))
    with caplog.at_level(logging.INFO, logger="pdfleet.sim"):
        kv.log_transfers()
        kv.log_transfers()  # nothing new: no second line
    lines = [r.getMessage() for r in caplog.records if "KV Transfer metrics" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("KV Transfer metrics: Num successful transfers=1, ")
    logged = [item.split("=")[0] for item in lines[0].removeprefix("KV Transfer metrics: ").split(", ")]
    keys = kv.cfg.release.transfer_log("NixlConnector")
    assert keys is not None and tuple(logged) == keys.keys  # the release's own keys, in its order


def test_a_consumer_pulls_only_the_blocks_past_its_own_prefix_cache_hit() -> None:
    """vLLM's decode side looks its own prefix cache up first and reads only the uncomputed blocks: a
    500-token prompt (32 blocks at the producer) whose first 20 blocks are cached here pulls 12."""
    kv, _ = _connector("kv_consumer", "--sim-link", "roce-400g")
    hashes = tuple(bytes([i]) * 8 for i in range(31))

    async def run() -> SimRequest:
        kv.clock.start(asyncio.get_running_loop())
        warm = SimRequest("warm", 330, 1, block_hashes=hashes[:20])  # 20 full blocks, served here
        kv.engine.add(warm, 0.0)
        kv.engine.complete(kv.engine.schedule(0.0), 0.1)
        assert warm.state is State.FINISHED
        grant = ReadGrant(500, 32, 500 * KV_BYTES_8B)
        side, params = await _producer(kv, grant, lambda rid: None)
        req = SimRequest("d", 500, 3, remote_prefill=params, block_hashes=hashes)
        kv.engine.add(req, 0.2)
        assert kv.engine.schedule(0.2).kv_loads == [req]
        try:
            await kv.load(req)
        finally:
            await side.close()
        return req

    req = asyncio.run(run())
    m = kv.metrics
    assert kv.engine.prefix_cache_hits == 320 and req.cached == (320, 499 - 320)
    assert (m.nixl_descriptors.total, m.nixl_bytes.total) == (12, 500 * KV_BYTES_8B * 12 // 32)
    assert m.nixl_xfer.total == pytest.approx(kv.cfg.link.transfer_time(500 * KV_BYTES_8B * 12 // 32))


@pytest.mark.parametrize(
    ("local", "expected"), [(0, (32, 32 * 1000)), (320, (12, 12 * 1000)), (511, (1, 1000)), (9999, (0, 0))]
)
def test_missing_blocks_are_the_grant_s_past_the_local_hit(local: int, expected: tuple[int, int]) -> None:
    assert missing(ReadGrant(512, 32, 32 * 1000), local, 16) == expected


def test_kv_held_for_another_prompt_length_is_not_loaded() -> None:
    """A prompt count that does not match the producer's (a forged or stale one) fails the load."""
    kv, _ = _connector("kv_consumer")

    async def run() -> Sink:
        kv.clock.start(asyncio.get_running_loop())
        grant = ReadGrant(500, 32, 500 * KV_BYTES_8B)
        side, params = await _producer(kv, grant, lambda rid: None)
        sink = Sink("completion", "cmpl-d", MODEL, False, False, asyncio.get_running_loop())
        req = SimRequest("d", 1, 3, remote_prefill=params, sink=sink)
        kv.engine.add(req, 0.0)
        kv.engine.schedule(0.0)
        try:
            await kv.load(req)
        finally:
            await side.close()
        return sink

    sink = asyncio.run(run())
    assert sink.error is not None and kv.metrics.nixl_failed_transfers == 1


def test_a_failed_load_fails_the_request_under_the_fail_policy() -> None:
    kv, woken = _connector("kv_consumer")

    async def run() -> Sink:
        sink = Sink("completion", "cmpl-d", MODEL, False, False, asyncio.get_running_loop())
        req = SimRequest("d", 500, 3, remote_prefill={}, sink=sink)  # no remote address: handshake fails
        kv.engine.add(req, 0.0)
        kv.engine.schedule(0.0)
        await kv.load(req)
        return sink

    sink = asyncio.run(run())
    assert sink.done.done() and sink.error is not None and "kv_load_failure_policy=fail" in sink.error
    assert kv.metrics.nixl_failed_transfers == 1 and kv.metrics.success["error"] == 1 and woken == [None]


def _release_connector(version: str) -> KVConnector:
    """A consumer modelling one release, its metrics registered as that release registers them."""
    args = [MODEL, "--sim-vllm-version", version, "--kv-transfer-config", kv_config("kv_consumer")]
    cfg = parse_serve_args(args, env={})
    assert cfg.kv_transfer is not None
    metrics = SimMetrics(cfg.max_model_len, pd=True, release=cfg.release)
    return KVConnector(cfg, cfg.kv_transfer, cfg.engine(), metrics, SimClock(0.001), lambda: None)


@pytest.mark.parametrize(("version", "failed_transfers"), [("0.33.0", 1), ("0.11.2", 0)])
def test_a_failed_notification_counts_as_the_release_counts_it(version: str, failed_transfers: int) -> None:
    """0.33's NixlPromMetrics.observe adds failed notifications to nixl_num_failed_transfers as well (kept
    in nixl_num_failed_notifications for compatibility); 0.11.2 counts them apart (issue 25 item 3)."""
    kv = _release_connector(version)

    def refuse(rid: str) -> None:
        raise ValueError("the producer drops the notification")

    async def run() -> None:
        kv.clock.start(asyncio.get_running_loop())
        grant = ReadGrant(500, 32, 500 * KV_BYTES_8B)
        side, params = await _producer(kv, grant, refuse)
        req = SimRequest("d", 500, 3, remote_prefill=params)
        kv.engine.add(req, 0.0)
        kv.engine.schedule(0.0)
        try:
            await kv.load(req)
        finally:
            await side.close()

    asyncio.run(run())
    m = kv.metrics
    assert (m.nixl_failed_notifications, m.nixl_failed_transfers, m.nixl_xfer.n) == (1, failed_transfers, 1)


@pytest.mark.parametrize(("version", "recovers"), [("0.11.0", False), ("0.11.2", True)])
def test_a_failed_handshake_recovers_only_where_the_release_reports_load_errors(
    version: str, recovers: bool
) -> None:
    """0.11.1+ mark the blocks invalid and recompute (no kv_load_failure_policy field yet); 0.11.0 has no
    get_block_ids_with_load_errors, so nothing is recomputed: the request fails (issue 25 item 5)."""
    kv = _release_connector(version)

    async def run() -> Sink:
        sink = Sink("completion", "cmpl-d", MODEL, False, False, asyncio.get_running_loop())
        req = SimRequest("d", 500, 3, remote_prefill={}, sink=sink)  # no remote address: handshake fails
        kv.engine.add(req, 0.0)
        kv.engine.schedule(0.0)
        await kv.load(req)
        return sink

    sink = asyncio.run(run())
    assert (sink.error is None) is recovers and kv.metrics.nixl_failed_transfers == 1
    assert kv._receive_timeout_s() == (5.0 if recovers else None)  # zmq.RCVTIMEO 5000 ms; 0.11.0 none


def test_without_a_receive_timeout_the_handshake_waits_for_a_silent_producer() -> None:
    """0.11.0 sets no zmq.RCVTIMEO on its handshake query: a producer that never answers is waited for
    (0.11.1+ give up after 5 s, a handshake failure)."""

    async def run() -> tuple[bool, str]:
        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await asyncio.sleep(30)

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        params = {"remote_host": "127.0.0.1", "remote_port": port, "remote_request_id": "p"}

        async def never(grant: ReadGrant) -> None:
            raise AssertionError("no grant from a silent producer")

        waiting = asyncio.ensure_future(pull(params, "c", never, None))
        await asyncio.sleep(1.0)
        still = not waiting.done()
        waiting.cancel()
        try:
            await pull(params, "c", never, 0.2)
            bounded = "answered"
        except PullError as exc:
            bounded = str(exc)
        server.close()
        return still, bounded

    still, bounded = asyncio.run(run())
    assert still and "failed" in bounded


# ---- two simulator processes ------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["0.33.0", "0.11.0"])
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[SimProcess, SimProcess]]:
    """A producer and a consumer modelling one vLLM release (each release the table has)."""
    side = free_port()
    common = ["--sim-time-scale", "0.1", "--sim-log-interval", "1", "--sim-vllm-version", request.param]
    producer = SimProcess(
        [MODEL, *common, "--kv-transfer-config", kv_config("kv_producer")],
        env={"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side)},
    )
    consumer = SimProcess(
        [MODEL, *common, "--sim-link", "roce-400g", "--kv-transfer-config", kv_config("kv_consumer")]
    )
    with producer as p, consumer as d:
        yield p, d


def test_vllm_router_serves_a_streaming_chat_through_the_pair(pair: tuple[SimProcess, SimProcess]) -> None:
    producer, consumer = pair
    before_p, before_d = scrape_metrics(producer.url), scrape_metrics(consumer.url)
    with RouterProcess([producer.url], [consumer.url]) as router:
        client = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        prompt = "y" * 4000  # 1000 tokens + 3 + 1 for the chat message
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 12
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12
    prompt_tokens = chunks[-1].usage.prompt_tokens
    assert prompt_tokens == 1004
    after_p, after_d = scrape_metrics(producer.url), scrape_metrics(consumer.url)
    # the producer prefilled (one token, max_tokens=1 from the router); the consumer pulled exactly that KV
    assert after_p["vllm:request_success_total"] == before_p["vllm:request_success_total"] + 1
    # both count the whole prompt once (vLLM's IterationStats at the first token), the consumer the KV it
    # received included: a decode pool's prompt rate is the prompts it serves (issue 25 item 2)
    for before, after in ((before_p, after_p), (before_d, after_d)):
        assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == prompt_tokens
    if "--sim-vllm-version" in consumer.argv and "0.11.0" in consumer.argv:
        # 0.11 registers no vllm:nixl_* metrics (its transfers show in the log line only)
        assert not any(name.startswith("vllm:nixl_") for name in after_d)
    else:
        count = "vllm:nixl_bytes_transferred_count"
        assert after_d[count] == before_d[count] + 1
        moved = after_d["vllm:nixl_bytes_transferred_sum"] - before_d["vllm:nixl_bytes_transferred_sum"]
        assert moved == prompt_tokens * KV_BYTES_8B
        failed = "vllm:nixl_num_failed_transfers_total"
        assert after_d[failed] == before_d[failed]
    assert after_p["vllm:kv_cache_usage_perc"] == 0.0  # blocks freed after the consumer's notification
    # the router forwards the producer's kv_transfer_params whole: the consumer did not re-tokenize
    reused = "pdfleet_sim_prompt_counts_reused_total"
    assert after_d[reused] == before_d[reused] + 1
    # the release's own wording (0.11.0's NixlKVConnectorStats.reduce counts transfers only)
    words = "num_successful_transfers=" if "0.11.0" in consumer.argv else "Num successful transfers="
    wait_for(lambda: f"KV Transfer metrics: {words}" in consumer.log())


def test_a_consumer_caches_what_it_pulled_so_a_longer_prompt_pulls_only_its_new_blocks(
    pair: tuple[SimProcess, SimProcess],
) -> None:
    """As vLLM's scheduler caches a request's blocks once their remote KV arrived: an agent's next turn
    (its history plus 400 tokens) finds the history in the consumer's own prefix cache and pulls the rest."""
    producer, consumer = pair
    history = "w" * 8000  # 2000 tokens: 125 full blocks
    with RouterProcess([producer.url], [consumer.url]) as router:
        client = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        client.completions.create(model=MODEL, prompt=history, max_tokens=2)
        before = scrape_metrics(consumer.url)
        client.completions.create(model=MODEL, prompt=history + "v" * 1600, max_tokens=2)
        after = scrape_metrics(consumer.url)
    hits = "vllm:prefix_cache_hits_total"
    assert after[hits] - before[hits] == 2000  # the history, all 125 blocks of it
    if "0.11.0" not in consumer.argv:  # 0.11 registers no vllm:nixl_* metrics
        moved = after["vllm:nixl_bytes_transferred_sum"] - before["vllm:nixl_bytes_transferred_sum"]
        assert moved == 400 * KV_BYTES_8B  # the new 400 tokens only, not the 2400 of the prompt


def test_kv_transfer_params_round_trip_without_router(pair: tuple[SimProcess, SimProcess]) -> None:
    """Both legs carry one X-Request-Id, as a proxy sends (0.11 pairs P and D by it)."""
    producer, consumer = pair
    old = "0.11.0" in consumer.argv
    leg = {"X-Request-Id": "round-trip-1"}
    status, prefill = post_json(
        producer.url + "/v1/completions",
        {
            "model": MODEL,
            "prompt": "z" * 8000,
            "max_tokens": 1,
            "stream": False,
            "kv_transfer_params": {
                "do_remote_decode": True,
                "do_remote_prefill": False,
                "remote_engine_id": None,
                "remote_block_ids": None,
                "remote_host": None,
                "remote_port": None,
            },
        },
        leg,
    )
    assert status == 200
    params = prefill["kv_transfer_params"]
    keys = {
        "do_remote_prefill",
        "do_remote_decode",
        "remote_engine_id",
        "remote_block_ids",
        "remote_host",
        "remote_port",
        "tp_size",
        "pdfleet_sim_prompt_tokens",
        "pdfleet_sim_prompt_digest",
    }
    if old:
        assert set(params) == keys
        blocks = params["remote_block_ids"]
    else:
        assert set(params) == keys | {
            "remote_request_id",
            "dcp_size",
            "pp_size",
            "remote_num_tokens",
            "remote_blocks_expiry_time",
            "remote_registration_generation",
            "transfer_mode",
        }
        (blocks,) = params["remote_block_ids"]  # one list per KV-cache group
        assert params["remote_blocks_expiry_time"] is None  # 0.33 sets it on D's turn-2 blocks only
    assert params["do_remote_prefill"] is True and params["tp_size"] == 1
    assert len(blocks) == 2000 // 16
    assert scrape_metrics(producer.url)["vllm:kv_cache_usage_perc"] > 0  # held for the consumer
    body = {"model": MODEL, "prompt": "z" * 8000, "max_tokens": 5, "kv_transfer_params": params}
    status, out = post_json(consumer.url + "/v1/completions", body, leg)
    assert status == 200 and out["usage"]["completion_tokens"] == 5
    assert scrape_metrics(producer.url)["vllm:kv_cache_usage_perc"] == 0.0
    # a second pull of the same blocks fails: they were freed. 0.33's kv_load_failure_policy "fail"
    # answers 500; 0.11.0 reports no load errors, so nothing is recomputed: the request fails too
    status, err = post_json(consumer.url + "/v1/completions", body, leg)
    assert status == 500 and "KV transfer" in err["error"]["message"]
    if old:
        assert "reports no KV load errors (no get_block_ids_with_load_errors)" in consumer.log()


def test_recompute_policy_and_lease_expiry() -> None:
    side = free_port()
    producer = SimProcess(
        [
            MODEL,
            "--sim-time-scale",
            "0.1",
            "--kv-transfer-config",
            kv_config("kv_producer", kv_connector_extra_config={"kv_lease_duration": 10}),
        ],
        env={"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side)},
    )
    consumer = SimProcess(
        [
            MODEL,
            "--sim-time-scale",
            "0.1",
            "--kv-transfer-config",
            kv_config("kv_consumer", kv_load_failure_policy="recompute"),
        ]
    )
    with producer as p, consumer as d:
        _, prefill = post_json(
            p.url + "/v1/completions",
            {
                "model": MODEL,
                "prompt": "q" * 400,
                "max_tokens": 1,
                "kv_transfer_params": {"do_remote_decode": True},
            },
        )
        assert scrape_metrics(p.url)["vllm:kv_cache_usage_perc"] > 0
        # lease of 10 simulated seconds = 1 s of wall time at scale 0.1
        wait_for(lambda: scrape_metrics(p.url)["vllm:nixl_num_kv_expired_reqs_total"] == 1)
        assert scrape_metrics(p.url)["vllm:kv_cache_usage_perc"] == 0.0
        assert "Releasing expired KV blocks for request" in p.log()
        status, out = post_json(
            d.url + "/v1/completions",
            {
                "model": MODEL,
                "prompt": "q" * 400,
                "max_tokens": 3,
                "kv_transfer_params": prefill["kv_transfer_params"],
            },
        )
        assert status == 200 and out["usage"]["completion_tokens"] == 3  # recomputed locally
        assert scrape_metrics(d.url)["vllm:nixl_num_failed_transfers_total"] == 1


@pytest.mark.parametrize("version", ["0.33.0", "0.11.2"])
def test_a_waiting_consumer_keeps_a_0_33_lease_alive_a_0_11_timeout_runs_out(version: str) -> None:
    """The consumer is busy (max_num_seqs 1, a 2000-token decode, ~13 simulated s) while the second
    request's KV waits on the producer with a 6 s hold: 0.33's heartbeats renew the lease and the KV
    is read; 0.11.2's fixed timeout frees it first, and the consumer recomputes (no policy field; the
    worker reports the invalid blocks; 0.11.0 cannot: see the handshake test above)."""
    side = free_port()
    lease = {"kv_connector_extra_config": {"kv_lease_duration": 6}} if version == "0.33.0" else {}
    common = [MODEL, "--sim-time-scale", "0.1", "--sim-vllm-version", version]
    producer = SimProcess(
        [*common, "--kv-transfer-config", kv_config("kv_producer", **lease)],
        env={
            "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
            "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side),
            "VLLM_NIXL_ABORT_REQUEST_TIMEOUT": "6",
        },
    )
    consumer = SimProcess(
        [*common, "--max-num-seqs", "1", "--kv-transfer-config", kv_config("kv_consumer", **lease)]
    )
    with producer as p, consumer as d:
        leg = {"X-Request-Id": f"busy-{version}"}
        body = {
            "model": MODEL,
            "prompt": "q" * 400,
            "max_tokens": 1,
            "kv_transfer_params": {"do_remote_decode": True},
        }
        _, prefill = post_json(p.url + "/v1/completions", body, leg)
        busy = {"model": MODEL, "prompt": "b", "max_tokens": 2000, "ignore_eos": True}
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(post_json, d.url + "/v1/completions", busy)
            wait_for(lambda: scrape_metrics(d.url)["vllm:num_requests_running"] == 1)
            status, out = post_json(
                d.url + "/v1/completions",
                {
                    "model": MODEL,
                    "prompt": "q" * 400,
                    "max_tokens": 3,
                    "kv_transfer_params": prefill["kv_transfer_params"],
                },
                leg,
            )
            assert first.result()[0] == 200
        assert status == 200 and out["usage"]["completion_tokens"] == 3
        expired = "Releasing expired KV blocks for request" in p.log()
        if version == "0.33.0":
            assert not expired and scrape_metrics(d.url)["vllm:nixl_num_failed_transfers_total"] == 0
            assert scrape_metrics(p.url)["vllm:nixl_num_kv_expired_reqs_total"] == 0
        else:
            assert expired and "NIXL transfer failed for request" in d.log()
        assert scrape_metrics(p.url)["vllm:kv_cache_usage_perc"] == 0.0


def test_p_and_d_on_different_releases_fail_the_handshake_unless_compat_is_not_enforced() -> None:
    """0.33 hashes the vLLM version (handshake.hash_factors): P on 0.11 and D on 0.33 do not match;
    enforce_handshake_compat: false leaves the version out; two 0.33 instances match."""
    old, _ = _connector("kv_producer", "--sim-vllm-version", "0.11.0")
    new, _ = _connector("kv_consumer")
    lax, _ = _connector("kv_consumer", kv_connector_extra_config={"enforce_handshake_compat": False})
    assert new.compat != old.compat and lax.compat == old.compat
    assert new.compat == _connector("kv_producer")[0].compat

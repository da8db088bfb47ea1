"""MooncakeConnector's side of P/D: the bootstrap server's API as vLLM's, the kv_transfer_params the
router sends, and the real `vllm-router --kv-connector mooncake` driving a pair of simulators."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import aiohttp
import openai
import pytest

from pdfleet.bench.launch import RouterProcess, SimProcess, free_port
from pdfleet.errors import ValidationError
from pdfleet.metrics.scrape import scrape_metrics
from pdfleet.model.vllm_release_data import RELEASES
from pdfleet.sim import mooncake
from pdfleet.sim.config import parse_serve_args
from tests.unit.sim.helpers import MODEL, wait_for

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py


def _mooncake(role: str, **extra: Any) -> str:
    return json.dumps({"kv_connector": "MooncakeConnector", "kv_role": role, **extra})


def test_the_names_are_the_release_s_own() -> None:
    proto = RELEASES["0.33.0"].mooncake_protocol
    assert proto is not None and set(mooncake.CONSUMER_KEYS) <= set(proto.read)
    assert mooncake.PRODUCER_KEY in proto.read
    assert set(proto.bootstrap_routes) == {("POST", "/register"), ("GET", "/query")}
    fields = dict(proto.bootstrap_schemas)["RegisterWorkerPayload"]
    assert [name for name, _ in fields] == ["engine_id", "dp_rank", "tp_rank", "pp_rank", "addr"]
    assert RELEASES["0.11.0"].mooncake_protocol is None  # no MooncakeConnector before 0.13


def test_mooncake_needs_a_release_that_has_it_and_holds_for_its_own_timeout() -> None:
    with pytest.raises(ValidationError, match="Unsupported connector type: MooncakeConnector"):
        parse_serve_args(
            [MODEL, "--sim-vllm-version", "0.11.0", "--kv-transfer-config", _mooncake("kv_producer")], env={}
        )
    cfg = parse_serve_args([MODEL, "--kv-transfer-config", _mooncake("kv_producer")], env={})
    assert (cfg.abort_timeout_s, cfg.mooncake_bootstrap_port) == (480.0, 8998)  # the release's env defaults
    env = {"VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT": "60", "VLLM_MOONCAKE_BOOTSTRAP_PORT": "9100"}
    cfg = parse_serve_args([MODEL, "--kv-transfer-config", _mooncake("kv_producer")], env=env)
    assert (cfg.abort_timeout_s, cfg.mooncake_bootstrap_port) == (60.0, 9100)


def test_the_bootstrap_server_registers_and_answers_as_vllm_s() -> None:
    async def run() -> list[tuple[int, Any]]:
        server, port = mooncake.BootstrapServer(), free_port()
        await server.start("127.0.0.1", port)
        base = f"http://127.0.0.1:{port}"
        worker = {"engine_id": "eng-p", "dp_rank": 0, "tp_rank": 0, "pp_rank": 0, "addr": "tcp://127.0.0.1:7"}
        out = []
        try:
            async with aiohttp.ClientSession() as session:
                for body in (
                    worker,
                    worker,  # an identical retry is fine
                    {**worker, "addr": "tcp://127.0.0.1:8"},  # the same ranks elsewhere: refused
                    {**worker, "engine_id": "other"},  # another engine on the same DP rank: refused
                    {**worker, "dp_rank": "zero"},  # not a RegisterWorkerPayload
                ):
                    async with session.post(base + "/register", json=body) as resp:
                        out.append((resp.status, await resp.json()))
                async with session.get(base + "/query") as resp:
                    out.append((resp.status, await resp.json()))
            engines = await mooncake.query(base)
            out.append((0, mooncake.worker_endpoint(engines, "eng-p", base)))
            with pytest.raises(mooncake.BootstrapError, match="remote engine_id nope not found"):
                mooncake.worker_endpoint(engines, "nope", base)
        finally:
            await server.close()
        with pytest.raises(mooncake.BootstrapError, match="Failed to connect to bootstrap server"):
            await mooncake.query(base)
        return out

    answers = asyncio.run(run())
    assert answers[0] == answers[1] == (200, {"status": "ok"})
    assert answers[2][0] == 400 and "is already registered at tcp://127.0.0.1:7" in answers[2][1]["detail"]
    assert answers[3][0] == 400 and "Engine ID mismatch for dp_rank=0" in answers[3][1]["detail"]
    assert answers[4][0] == 422 and answers[4][1]["detail"][0]["loc"] == ["body", "dp_rank"]
    assert answers[5] == (
        200,
        {"0": {"engine_id": "eng-p", "worker_addr": {"0": {"0": "tcp://127.0.0.1:7"}}}},
    )
    assert answers[6] == (0, ("127.0.0.1", 7))


# ---- the real router over two simulator processes ------------------------------------------------------


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[SimProcess, SimProcess, int]]:
    """A MooncakeConnector producer (its bootstrap server on a free port) and consumer, vLLM 0.33."""
    boot = free_port()
    common = ["--sim-time-scale", "0.1", "--sim-log-interval", "1"]
    producer = SimProcess(
        [MODEL, *common, "--kv-transfer-config", _mooncake("kv_producer")],
        env={"VLLM_MOONCAKE_BOOTSTRAP_PORT": str(boot)},
    )
    consumer = SimProcess(
        [MODEL, *common, "--sim-link", "roce-400g", "--kv-transfer-config", _mooncake("kv_consumer")]
    )
    with producer as p, consumer as d:
        yield p, d, boot


def test_vllm_router_in_mooncake_mode_streams_a_chat_through_the_pair(
    pair: tuple[SimProcess, SimProcess, int],
) -> None:
    producer, consumer, boot = pair
    before_p, before_d = scrape_metrics(producer.url), scrape_metrics(consumer.url)
    mode = {"kv_connector": "mooncake", "bootstrap_ports": [boot]}
    router_proc = RouterProcess([producer.url], [consumer.url], **mode)  # type: ignore[arg-type]
    with router_proc as router:
        # the router asked P's bootstrap server for its engine ids when it started
        assert "Got Mooncake engine_ids for" in router.log()
        client = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "z" * 4000}],
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 12
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == 1004
    after_p, after_d = scrape_metrics(producer.url), scrape_metrics(consumer.url)
    assert after_p["vllm:request_success_total"] == before_p["vllm:request_success_total"] + 1
    # the consumer read the held blocks over the worker address P registered, and P freed them
    assert after_p["vllm:kv_cache_usage_perc"] == 0.0
    log = consumer.log()
    assert "Mooncake transfer failed" not in log and "Got invalid KVTransferParams" not in log
    assert "Mooncake Bootstrap Server started at 127.0.0.1" in producer.log()
    # D counts the whole prompt once, as vLLM does (issue 25 item 2), the KV it received included
    counted = after_d["vllm:prompt_tokens_total"] - before_d["vllm:prompt_tokens_total"]
    assert counted == 1004
    assert not any(name.startswith("vllm:nixl_") for name in after_d)  # NixlConnector's, not Mooncake's
    # MooncakeConnector's own metrics (issue 25 item 4): it pushes from P, so P observes the transfer
    count, size = "vllm:mooncake_xfer_time_seconds_count", "vllm:mooncake_bytes_transferred_sum"
    assert after_p[count] == before_p[count] + 1 and after_d[count] == before_d[count]
    assert after_p[size] - before_p[size] == 1004 * 131072  # the prompt's KV, Llama-3.1-8B in bf16
    assert after_p["vllm:mooncake_xfer_time_seconds_sum"] > before_p["vllm:mooncake_xfer_time_seconds_sum"]
    assert after_d["vllm:mooncake_num_failed_recvs_total"] == before_d["vllm:mooncake_num_failed_recvs_total"]
    # Mooncake's P returns no kv_transfer_params: the consumer counted the prompt itself
    reused = "pdfleet_sim_prompt_counts_reused_total"
    assert after_d[reused] == before_d[reused]


def test_a_decode_request_without_the_bootstrap_address_is_prefilled_locally(
    pair: tuple[SimProcess, SimProcess, int],
) -> None:
    _, consumer, _ = pair
    client = openai.OpenAI(base_url=consumer.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    params = {"do_remote_prefill": True, "do_remote_decode": False, "transfer_id": "xfer-1"}
    out = client.completions.create(
        model=MODEL, prompt="w" * 400, max_tokens=3, extra_body={"kv_transfer_params": params}
    )
    assert out.usage is not None and out.usage.completion_tokens == 3
    wait_for(lambda: "Got invalid KVTransferParams" in consumer.log())

"""P/D between two simulator processes: the kv_transfer_params protocol, the side channel, and the real
vllm-router (PyPI `vllm-router`) driving a producer and a consumer end to end."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from pdfleet.bench.launch import RouterProcess, SimProcess, free_port
from pdfleet.metrics.scrape import scrape_metrics

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
KV_BYTES_8B = 131072


def _kv(role: str, **extra: Any) -> str:
    return json.dumps({"kv_connector": "NixlConnector", "kv_role": role, **extra})


def _post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _wait_for(pred: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[SimProcess, SimProcess]]:
    side = free_port()
    common = ["--sim-time-scale", "0.1", "--sim-log-interval", "1"]
    producer = SimProcess(
        [MODEL, *common, "--kv-transfer-config", _kv("kv_producer")],
        env={"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side)},
    )
    consumer = SimProcess(
        [MODEL, *common, "--sim-link", "roce-400g", "--kv-transfer-config", _kv("kv_consumer")]
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
    assert after_d["vllm:nixl_bytes_transferred_count"] == before_d["vllm:nixl_bytes_transferred_count"] + 1
    moved = after_d["vllm:nixl_bytes_transferred_sum"] - before_d["vllm:nixl_bytes_transferred_sum"]
    assert moved == prompt_tokens * KV_BYTES_8B
    assert after_d["vllm:nixl_num_failed_transfers_total"] == before_d["vllm:nixl_num_failed_transfers_total"]
    assert after_p["vllm:kv_cache_usage_perc"] == 0.0  # blocks freed after the consumer's notification
    _wait_for(lambda: "KV Transfer metrics: Num successful transfers=" in consumer.log())


def test_kv_transfer_params_round_trip_without_router(pair: tuple[SimProcess, SimProcess]) -> None:
    producer, consumer = pair
    status, prefill = _post(
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
    )
    assert status == 200
    params = prefill["kv_transfer_params"]
    assert set(params) >= {
        "do_remote_prefill",
        "do_remote_decode",
        "remote_engine_id",
        "remote_block_ids",
        "remote_request_id",
        "remote_host",
        "remote_port",
        "tp_size",
    }
    assert params["do_remote_prefill"] is True and params["tp_size"] == 1
    assert len(params["remote_block_ids"]) == 2000 // 16
    assert scrape_metrics(producer.url)["vllm:kv_cache_usage_perc"] > 0  # held for the consumer
    status, out = _post(
        consumer.url + "/v1/completions",
        {"model": MODEL, "prompt": "z" * 8000, "max_tokens": 5, "kv_transfer_params": params},
    )
    assert status == 200 and out["usage"]["completion_tokens"] == 5
    assert scrape_metrics(producer.url)["vllm:kv_cache_usage_perc"] == 0.0
    # a second pull of the same blocks fails: they were freed (policy "fail" is the default)
    failed_before = scrape_metrics(consumer.url)["vllm:nixl_num_failed_transfers_total"]
    status, err = _post(
        consumer.url + "/v1/completions",
        {"model": MODEL, "prompt": "z" * 8000, "max_tokens": 5, "kv_transfer_params": params},
    )
    assert status == 500 and "KV transfer" in err["error"]["message"]
    assert scrape_metrics(consumer.url)["vllm:nixl_num_failed_transfers_total"] == failed_before + 1


def test_recompute_policy_and_lease_expiry() -> None:
    side = free_port()
    producer = SimProcess(
        [
            MODEL,
            "--sim-time-scale",
            "0.1",
            "--kv-transfer-config",
            _kv("kv_producer", kv_connector_extra_config={"kv_lease_duration": 10}),
        ],
        env={"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side)},
    )
    consumer = SimProcess(
        [
            MODEL,
            "--sim-time-scale",
            "0.1",
            "--kv-transfer-config",
            _kv("kv_consumer", kv_load_failure_policy="recompute"),
        ]
    )
    with producer as p, consumer as d:
        _, prefill = _post(
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
        _wait_for(lambda: scrape_metrics(p.url)["vllm:nixl_num_kv_expired_reqs_total"] == 1)
        assert scrape_metrics(p.url)["vllm:kv_cache_usage_perc"] == 0.0
        assert "Releasing expired KV blocks for request" in p.log()
        status, out = _post(
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

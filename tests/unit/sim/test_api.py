"""The simulator's OpenAI-compatible API: request validation directly, then a real process against real
clients (the OpenAI Python SDK, raw HTTP)."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import re
import socket
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from prometheus_client.core import CollectorRegistry

from pdfleet.bench.client import request_bytes
from pdfleet.bench.launch import SimProcess
from pdfleet.metrics.scrape import scrape_metrics
from pdfleet.sim.api import RequestError, SimAPI
from pdfleet.sim.config import parse_serve_args
from pdfleet.sim.des import run_alone
from pdfleet.sim.runtime import Runtime
from pdfleet.tokens import make_counter
from tests.unit.sim.helpers import MODEL, wait_for

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py

# ---- validation, in process -------------------------------------------------------------------------


def _api(*args: str) -> SimAPI:
    cfg = parse_serve_args([MODEL, "--served-model-name", "llama", "--max-model-len", "1000", *args], env={})
    return SimAPI(cfg, Runtime(cfg), CollectorRegistry(), make_counter(None))


CHAT = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("kind", "body", "expected"),
    [
        ("completion", {"prompt": "x" * 40}, ("llama", 10, 16, "length", False, False)),
        ("chat", CHAT, ("llama", 5, 128, "stop", False, False)),
        ("chat", {**CHAT, "min_tokens": 200}, ("llama", 5, 200, "stop", False, False)),
        ("chat", {**CHAT, "ignore_eos": True}, ("llama", 5, 995, "length", False, False)),
        (
            "chat",
            {**CHAT, "max_completion_tokens": 7, "max_tokens": 9},
            ("llama", 5, 7, "length", False, False),
        ),
        (
            "chat",
            {**CHAT, "model": "llama", "stream": True, "stream_options": {"include_usage": True}},
            ("llama", 5, 128, "stop", True, True),
        ),
        ("completion", {"prompt": [1, 2, 3], "max_tokens": 2}, ("llama", 3, 2, "length", False, False)),
        # vLLM's lax pydantic booleans: "yes" and 1 stream, "off" does not
        ("chat", {**CHAT, "stream": "yes"}, ("llama", 5, 128, "stop", True, False)),
        ("chat", {**CHAT, "stream": 1}, ("llama", 5, 128, "stop", True, False)),
        ("chat", {**CHAT, "stream": "off"}, ("llama", 5, 128, "stop", False, False)),
    ],
)
def test_generation_requests_get_vllms_defaults(kind: str, body: dict[str, Any], expected: tuple) -> None:
    assert _api()._parse(body, kind) == expected


@pytest.mark.parametrize(
    ("kind", "body", "status", "param", "message"),
    [
        ("chat", {**CHAT, "model": "gpt-4"}, 404, "model", "The model `gpt-4` does not exist."),
        ("chat", {"messages": []}, 400, "messages", "messages: Field required"),
        ("completion", {"prompt": ""}, 400, "prompt", "prompt: Field required"),
        ("completion", {"prompt": ["a", "b"]}, 400, "prompt", "one prompt per request"),
        ("chat", {**CHAT, "n": 2}, 400, "n", "n=1 only"),
        ("chat", {**CHAT, "max_tokens": 0}, 400, "max_tokens", "max_tokens must be at least 1, got 0."),
        ("chat", {**CHAT, "max_tokens": True}, 400, "max_tokens", "max_tokens must be at least 1"),
        ("chat", {**CHAT, "min_tokens": -1}, 400, "min_tokens", "min_tokens must be at least 0"),
        ("completion", {"prompt": "x" * 4000}, 400, "prompt", "maximum context length is 1000 tokens"),
        ("chat", {**CHAT, "max_tokens": 996}, 400, "max_tokens", "you requested 1001 tokens"),
        ("chat", {**CHAT, "stream_options": {"include_usage": True}}, 400, "stream_options", "stream=True"),
        # issue 27 N15: both were accepted
        (
            "chat",
            {**CHAT, "max_tokens": 10, "min_tokens": 11},
            400,
            "min_tokens",
            "min_tokens must be less than or equal to max_tokens=10, got 11.",
        ),
        # vLLM's lax pydantic takes "yes" as true (the sim read it as N15 said); "maybe" it refuses
        ("chat", {**CHAT, "stream": "maybe"}, 400, "stream", "stream: Input should be a valid boolean"),
        ("chat", {**CHAT, "stream": 2}, 400, "stream", "stream: Input should be a valid boolean"),
    ],
)
def test_bad_generation_requests_get_vllms_errors(
    kind: str, body: dict[str, Any], status: int, param: str, message: str
) -> None:
    with pytest.raises(RequestError) as exc:
        _api()._parse(body, kind)
    resp = exc.value.response
    error = json.loads(resp.body)["error"]  # type: ignore[arg-type]
    assert resp.status == status and error["code"] == status and error["param"] == param
    assert message in error["message"]


# ---- a simulator process ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    with SimProcess(SIM_ARGS) as proc:
        yield proc


@pytest.fixture(scope="module")
def client(sim: SimProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=sim.url + "/v1", api_key="unused", max_retries=0, timeout=30)


SIM_ARGS = [MODEL, "--served-model-name", "llama", "--sim-time-scale", "0.1"]


def _metric(sim: SimProcess, name: str) -> float:
    return scrape_metrics(sim.url).get(name, 0.0)


def test_sdk_streams_chat_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="llama",
        messages=[{"role": "user", "content": "Tell me a story"}],
        max_tokens=7,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    content_chunks = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len(content_chunks) == 7  # one token per chunk
    assert content_chunks[-1].choices[0].finish_reason == "length"
    usage = chunks[-1].usage
    assert usage is not None and chunks[-1].choices == []
    assert usage.completion_tokens == 7
    # pdfleet.tokens rule: 3 per message + ceil(len("user")/4) + ceil(len("Tell me a story")/4)
    assert usage.prompt_tokens == 3 + 1 + 4


def test_sdk_non_streaming_chat_and_completion(client: openai.OpenAI) -> None:
    chat = client.chat.completions.create(
        model="llama", messages=[{"role": "user", "content": "hi"}], max_tokens=5
    )
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].finish_reason == "length"
    assert chat.usage is not None and chat.usage.completion_tokens == 5
    assert len(chat.choices[0].message.content.split()) == 5
    comp = client.completions.create(model="llama", prompt="x" * 400, max_tokens=3)
    assert comp.usage is not None and comp.usage.prompt_tokens == 100 and comp.usage.completion_tokens == 3
    streamed = list(client.completions.create(model="llama", prompt="hello", max_tokens=4, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == comp.choices[0].text + " fox"


def test_sdk_lists_models_and_gets_vllm_errors(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["llama"]
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(
            model="nope", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    assert "The model `nope` does not exist." in str(missing.value)
    with pytest.raises(openai.BadRequestError) as too_long:
        client.completions.create(model="llama", prompt="hi", max_tokens=200_000)
    assert "maximum context length is 131072 tokens" in str(too_long.value)


def test_role_chunk_is_not_sent_before_the_first_token(sim: SimProcess) -> None:
    """vLLM emits the role chunk with the first engine output: here both arrive in one HTTP chunk."""
    body = json.dumps(
        {
            "model": "llama",
            "messages": [{"role": "user", "content": "x" * 40000}],
            "max_tokens": 2,
            "stream": True,
        }
    )
    conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=30)
    conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
    assert resp.headers["Transfer-Encoding"] == "chunked"
    first = resp.read1(1 << 16).decode()  # the first HTTP chunk
    rest = resp.read().decode()
    conn.close()
    events = [e for e in (first + rest).split("\n\n") if e]
    assert '"role":"assistant"' in events[0] and '"content"' in events[0]
    assert '"content":" the"' in events[1]
    assert '"content":" the"' in first, "the role chunk was sent before the first token was ready"
    assert events[-1] == "data: [DONE]"
    assert all(e.startswith("data: ") for e in events)


def test_metrics_use_vllm_names_in_simulated_seconds(sim: SimProcess, client: openai.OpenAI) -> None:
    before = scrape_metrics(sim.url)
    out = client.completions.create(model="llama", prompt="ttft " + "x" * 4 * 4096, max_tokens=1)
    after = scrape_metrics(sim.url)
    hits = "vllm:prefix_cache_hits_total"
    assert out.usage is not None and after[hits] == before[hits]  # every block of the prompt computed
    ttft_ = "vllm:time_to_first_token_seconds"
    assert after[f"{ttft_}_count"] == before[f"{ttft_}_count"] + 1
    ttft = after[f"{ttft_}_sum"] - before[f"{ttft_}_sum"]
    # the engine model's TTFT for that prompt alone (~125 ms on H100 for 4K tokens), on the discrete-event
    # driver's clock: the metric is in simulated seconds (the wall time at scale 0.1 is a tenth of it), and
    # a busy machine adds nothing but what the loop gave up when it fell behind by over RESYNC_AFTER_S
    (alone,) = run_alone(parse_serve_args(SIM_ARGS, env={}).engine(), [(0.0, out.usage.prompt_tokens, 1)])
    lost = "pdfleet_sim_resync_lost_wall_seconds"
    assert alone.ttft > 0.1 and ttft == pytest.approx(alone.ttft + (after[lost] - before[lost]) / 0.1)
    text = urllib.request.urlopen(sim.url + "/metrics").read().decode()
    for name in (
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket",
        "vllm:request_queue_time_seconds_bucket",
        "vllm:request_prefill_time_seconds_bucket",
        "vllm:request_decode_time_seconds_bucket",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
    ):
        assert re.search(rf"^{re.escape(name)}{{", text, re.M), name
    assert "vllm:nixl_" not in text  # only on P/D instances
    # the simulator's own lateness, for benches to flag disturbed windows: under its own prefix
    for name in ("pdfleet_sim_step_lag_seconds_bucket", "pdfleet_sim_loop_lag_seconds_bucket"):
        assert re.search(rf'^{name}{{le="0.1"}} ', text, re.M), name


def test_api_key_guards_v1_only() -> None:
    with SimProcess([MODEL, "--api-key", "s3cret"]) as sim:
        good = openai.OpenAI(base_url=sim.url + "/v1", api_key="s3cret", max_retries=0)
        assert good.models.list().data[0].id == MODEL
        bad = openai.OpenAI(base_url=sim.url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
        assert urllib.request.urlopen(sim.url + "/health").status == 200
        assert urllib.request.urlopen(sim.url + "/metrics").status == 200


def test_chat_without_max_tokens_stops_at_the_simulated_eos(client: openai.OpenAI) -> None:
    chat = client.chat.completions.create(model="llama", messages=[{"role": "user", "content": "hi"}])
    assert chat.choices[0].finish_reason == "stop"
    assert chat.usage is not None and chat.usage.completion_tokens == 128
    forced = client.chat.completions.create(
        model="llama",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=3,
        extra_body={"ignore_eos": True},
    )
    assert forced.usage is not None and forced.usage.completion_tokens == 3


def test_kv_pressure_preempts_and_still_completes_every_request() -> None:
    """200 blocks × 16 tokens = 3200 KV slots; four 1000-token requests need 4000: someone is preempted.
    The prompts differ from their first token, so the prefix cache shares none of their blocks. At time
    scale 0.5 a request decodes for ~1.3 s of wall time, so the four overlap even when a loaded machine
    starts them hundreds of ms apart (at 0.05, ~0.13 s: CI's unit phase once saw no preemption)."""
    args = [MODEL, "--num-gpu-blocks-override", "200", "--max-model-len", "2048", "--sim-time-scale", "0.5"]
    with SimProcess(args) as sim:
        client = openai.OpenAI(base_url=sim.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            results = list(
                pool.map(
                    lambda i: client.completions.create(
                        model=MODEL, prompt=f"{i}" + "p" * 2399, max_tokens=400
                    ),
                    range(4),
                )
            )
        assert all(r.usage is not None and r.usage.completion_tokens == 400 for r in results)
        assert _metric(sim, "vllm:num_preemptions_total") >= 1
        assert _metric(sim, "vllm:kv_cache_usage_perc") == 0.0


@pytest.mark.parametrize("flag", [None, "--no-enable-prefix-caching"])
def test_a_shared_prefix_lowers_ttft_and_is_counted_unless_caching_is_off(flag: str | None) -> None:
    """Two chats sharing an 8000-character system prompt (~2000 tokens): the second one's prefill skips
    the cached blocks (vLLM's default), and /metrics counts the lookups in tokens."""
    args = [MODEL, "--sim-time-scale", "0.2", *([flag] if flag else [])]
    system = {"role": "system", "content": "You are a careful assistant. " * 280}
    with SimProcess(args) as sim:
        client = openai.OpenAI(base_url=sim.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        ttfts, prompts = [], []
        for question in ("What is a KV cache?", "And a prefix cache?"):
            chat = [system, {"role": "user", "content": question}]
            stream = client.chat.completions.create(
                model=MODEL,
                messages=chat,
                max_tokens=4,
                stream=True,  # type: ignore[arg-type]
                stream_options={"include_usage": True},
            )
            prompts += [c.usage.prompt_tokens for c in stream if c.usage is not None]
            # each request's TTFT in simulated seconds: the histogram's sum grows by it
            ttfts.append(_metric(sim, "vllm:time_to_first_token_seconds_sum") - sum(ttfts))
        queries = _metric(sim, "vllm:prefix_cache_queries_total")
        hits = _metric(sim, "vllm:prefix_cache_hits_total")
    if flag:
        assert (queries, hits) == (0.0, 0.0)
        return
    assert queries == sum(prompts)
    assert 0.8 * prompts[0] < hits < prompts[1] and hits % 16 == 0  # whole blocks of the shared system turn
    assert 0 < ttfts[1] < 0.6 * ttfts[0]


# ---- hostile bodies and clients that go away (issue 18 S1, S2) ---------------------------------------


def _raw_post(port: int, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    status, data = resp.status, resp.read()
    conn.close()
    return status, json.loads(data)


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "llama", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # past the parser's depth
        b'{"model": "llama", "prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}",  # past 4300 digits
        b'{"model": "llama", "prompt": ' + b"[" * 900 + b"1" + b"]" * 900 + b"}",  # parses, nests too deep
        b'{"model": "llama", "messages": [{"role": "user", "content": "hi"}, 7]}',
        b'{"model": "llama", "prompt": "hi", "max_tokens": 1e400}',
        b'{"model": ["llama"], "prompt": "hi"}',
        b"\xff\xfe not utf-8",
    ],
    ids=["deep-json", "long-int", "deep-prompt", "bad-message", "huge-float", "model-list", "bad-utf8"],
)
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_hostile_bodies_get_a_400_never_a_500(sim: SimProcess, path: str, body: bytes) -> None:
    status, out = _raw_post(sim.port, path, body)
    assert status in (400, 404), (status, out)
    assert out["error"]["code"] == status and out["error"]["type"] in ("BadRequestError", "NotFoundError")
    status, _ = _raw_post(sim.port, "/tokenize", body)
    assert status < 500
    ok = b'{"model": "llama", "prompt": "hi", "max_tokens": 1}'
    assert _raw_post(sim.port, "/v1/completions", ok)[0] == 200


def test_a_non_streaming_request_is_aborted_when_its_client_goes_away(sim: SimProcess) -> None:
    """vLLM aborts a request whose HTTP client disconnected, streamed or not."""
    aborted = _metric(sim, "vllm:request_success_total")  # every reason; abort is one of them
    body = json.dumps({"model": "llama", "prompt": "hi", "max_tokens": 100_000}).encode()
    sock = socket.create_connection(("127.0.0.1", sim.port))
    sock.sendall(request_bytes("127.0.0.1", sim.port, "/v1/completions", body, keepalive=False))
    wait_for(lambda: _metric(sim, "vllm:num_requests_running") == 1)
    sock.close()
    wait_for(lambda: _metric(sim, "vllm:num_requests_running") == 0)
    text = urllib.request.urlopen(sim.url + "/metrics").read().decode()
    (line,) = [s for s in text.splitlines() if s.startswith("vllm:request_success_total{") and "abort" in s]
    assert float(line.rsplit(" ", 1)[1]) >= 1 and _metric(sim, "vllm:request_success_total") == aborted + 1

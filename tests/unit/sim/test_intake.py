"""A request on its way in: its arrival stamp, parsing and validation, the P/D count shortcut, and that
tokenizing a long prompt no longer stalls the streams the simulator is serving."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pdfleet.bench.client import Record, StreamClient, request_bytes
from pdfleet.bench.launch import SimProcess
from pdfleet.bench.procs import free_port
from pdfleet.sim.config import parse_serve_args
from pdfleet.sim.intake import (
    PROMPT_DIGEST_KEY,
    PROMPT_TOKENS_KEY,
    ArrivalStamp,
    Intake,
    RequestError,
    parse_json,
    prompt_digest,
)
from pdfleet.tokens import make_counter
from tests.unit.sim.helpers import MODEL, kv_config, make_tokenizer, post_json, random_words, words_text

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py

# ---- the arrival stamp ----------------------------------------------------------------------------------


class _Inner:
    """Stands in for aiohttp's protocol: records what it was passed."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def connection_made(self, transport: Any) -> None:
        self.calls.append(("made", transport))

    def data_received(self, data: bytes) -> None:
        self.calls.append(("data", data))

    def eof_received(self) -> bool:
        self.calls.append(("eof", None))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.calls.append(("lost", exc))


def test_the_first_read_of_a_request_is_its_arrival_and_everything_is_passed_on() -> None:
    clock = iter([1.0, 2.0, 3.0])
    inner = _Inner()
    stamp = ArrivalStamp(inner, lambda: next(clock))  # type: ignore[arg-type]
    stamp.connection_made("t")  # type: ignore[arg-type]
    stamp.data_received(b"POST / HTTP/1.1\r\n")
    stamp.data_received(b"body")  # the same request's body: not a new arrival
    assert stamp.first_byte_at == 1.0
    stamp.first_byte_at = None  # the handler took it (take_arrival)
    stamp.data_received(b"POST / HTTP/1.1\r\n")
    assert stamp.first_byte_at == 2.0
    assert stamp.eof_received() is False
    stamp.connection_lost(None)
    assert [c[0] for c in inner.calls] == ["made", "data", "data", "data", "eof", "lost"]


# ---- parsing, validation, the producer's count ---------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "error parsing the body"),
        (b'{"max_tokens": ' + b"1" * 5000 + b"}", "error parsing the body"),
        (b'{"a": "\xff"}', "error parsing the body"),
        (b'{"a": ', "Invalid JSON body"),
        (b"[1, 2]", "must be a JSON object"),
    ],
    ids=["too-deep", "too-many-digits", "not-utf8", "truncated", "not-an-object"],
)
def test_bodies_the_json_parser_rejects_are_400s(raw: bytes, message: str) -> None:
    with pytest.raises(RequestError) as exc:
        parse_json(raw)
    assert exc.value.response.status == 400 and message in str(exc.value)


def _intake(role: str | None, tokenizer: Path | None = None) -> Intake:
    args = [MODEL] if role is None else [MODEL, "--kv-transfer-config", kv_config(role)]
    cfg = parse_serve_args(args, env={})
    return Intake(cfg, make_counter(str(tokenizer) if tokenizer else None), "test-counter")


def test_a_consumer_takes_the_producers_count_only_for_the_same_prompt() -> None:
    producer, consumer = _intake("kv_producer"), _intake("kv_consumer")
    try:
        prompt = {"model": MODEL, "prompt": "x" * 400, "max_tokens": 1}
        raw = json.dumps({**prompt, "kv_transfer_params": {"do_remote_decode": True}}).encode()
        prefilled = producer._prepare(raw, "completion")
        assert prefilled.parsed.prompt_tokens == 100
        assert prefilled.digest == prompt_digest(prompt, "test-counter")
        params = {"do_remote_prefill": True, PROMPT_TOKENS_KEY: 77, PROMPT_DIGEST_KEY: prefilled.digest}
        raw = json.dumps({**prompt, "kv_transfer_params": params}).encode()
        decoded = consumer._prepare(raw, "completion")
        assert (decoded.parsed.prompt_tokens, decoded.counted) == (77, False)  # the producer's word
        other = {**prompt, "prompt": "y" * 400, "kv_transfer_params": params}
        assert consumer._prepare(json.dumps(other).encode(), "completion").counted  # another prompt: counted
        plain = {**prompt, "kv_transfer_params": {"do_remote_prefill": True}}
        assert consumer._prepare(json.dumps(plain).encode(), "completion").counted  # a real vLLM producer
        assert producer._prepare(json.dumps(prompt).encode(), "completion").digest is None  # not P/D
    finally:
        producer.close()
        consumer.close()


def test_text_the_tokenizer_cannot_take_is_a_400(tmp_path: Path) -> None:
    intake = _intake(None, make_tokenizer(tmp_path / "tokenizer.json"))
    try:
        with pytest.raises(RequestError) as exc:
            intake._prepare(b'{"prompt": "a \\ud800 lone surrogate"}', "completion")
        assert exc.value.response.status == 400 and "could not be tokenized" in str(exc.value)
    finally:
        intake.close()


def test_counting_runs_in_the_intake_thread(tmp_path: Path) -> None:
    intake = _intake(None, make_tokenizer(tmp_path / "tokenizer.json"))
    seen: list[str] = []
    counter = intake.counter

    class Spy:
        def count(self, text: str) -> int:
            seen.append(threading.current_thread().name)
            return counter.count(text)

    intake.counter = Spy()
    try:
        raw = json.dumps({"prompt": words_text(50, 1), "max_tokens": 1}).encode()
        prepared = asyncio.run(intake.prepare(raw, "completion"))
        assert prepared.parsed.prompt_tokens == counter.count(words_text(50, 1))
        assert seen and all(name.startswith("pdfleet-sim-intake") for name in seen)
    finally:
        intake.close()


# ---- a 30K-token prompt does not stall a decode-only instance's streams ----------------------------------


async def _gaps_around(port: int, bursts: list[dict[str, Any]], window_s: float) -> list[tuple[float, float]]:
    """Per burst, one stream's worst inter-token gap in the window before it is sent and in the one after."""
    loop = asyncio.get_running_loop()
    url = f"http://127.0.0.1:{port}/v1/completions"
    # the client's own first urlopen (opener, proxies, a thread) must not stall the stream it measures
    await loop.run_in_executor(None, post_json, url, {"model": MODEL, "prompt": "hi", "max_tokens": 1})
    short = {"model": MODEL, "prompt": words_text(145, 7), "max_tokens": 4000, "ignore_eos": True}
    raw = json.dumps({**short, "stream": True}).encode()
    client = StreamClient("127.0.0.1", port, keepalive=False, parse=False)
    span = Record()
    request = request_bytes("127.0.0.1", port, "/v1/completions", raw, keepalive=False)
    stream = asyncio.create_task(client.run(request, span))
    await asyncio.sleep(0.5 + window_s)  # settled into decoding
    sent = []
    for burst in bursts:
        sent.append(time.perf_counter())
        status, out = await loop.run_in_executor(None, post_json, url, burst)
        assert status == 200, out
        await asyncio.sleep(max(0.0, sent[-1] + 2 * window_s - time.perf_counter()))
    stream.cancel()
    client.close()
    times = span.chunks

    def worst(lo: float, hi: float) -> float:
        inside = [t for t in times if lo <= t <= hi]
        return max(b - a for a, b in zip(inside, inside[1:], strict=False))

    return [(worst(t - window_s, t), worst(t, t + window_s)) for t in sent]


def _pd_bursts(producer_url: str, seeds: tuple[int, ...]) -> list[dict[str, Any]]:
    """Per seed, a ~30K-token prompt prefilled on the producer and the request a router then sends decode."""
    bursts = []
    for seed in seeds:
        long_prompt = random_words(5200, seed)  # ~30K tokens of the test tokenizer
        status, prefilled = post_json(
            producer_url + "/v1/completions",
            {
                "model": MODEL,
                "prompt": long_prompt,
                "max_tokens": 1,
                "kv_transfer_params": {"do_remote_decode": True},
            },
        )
        assert status == 200 and prefilled["usage"]["prompt_tokens"] > 27_000
        params = {
            k: v for k, v in prefilled["kv_transfer_params"].items() if not k.startswith("pdfleet_sim_")
        }  # as a real vLLM producer sends them: the consumer tokenizes the prompt itself
        bursts.append({"model": MODEL, "prompt": long_prompt, "max_tokens": 2, "kv_transfer_params": params})
    return bursts


def test_tokenizing_a_30k_token_prompt_does_not_stall_a_decode_instances_streams(tmp_path: Path) -> None:
    """A consumer (decode-only) streams; 30K-token P/D requests arrive and are tokenized there: the stall
    a stream sees stays under 40 ms.

    What this bounds is the stall, not where tokenizing runs: since tokenizing and hashing got faster, a
    30K-token request's intake takes ~20 ms of CPU here, and run on the loop (an experiment) it grew the
    worst gap by 1-14 ms, under the bound; test_counting_runs_in_the_intake_thread checks the thread. An
    80 ms stall put on the loop (another experiment) showed in one or two of a round's three bursts (never
    the first) in each of five rounds, but one other run had a round with none: the check is a bound on what
    a stream sees, not a detector of every stall. CPU noise grows the gap too, by up to ~30 ms now and then
    and once (CI, beside the lab) by 48 ms, so a second round of three fresh prompts is sent when the first
    goes over.
    """
    tokenizer = make_tokenizer(tmp_path / "tokenizer.json")
    common = ["--tokenizer", str(tokenizer), "--disable-log-stats", "--sim-link", "roce-400g"]
    env = {"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())}
    rounds = []
    with (
        SimProcess([MODEL, *common, "--kv-transfer-config", kv_config("kv_producer")], env=env) as p,
        SimProcess([MODEL, *common, "--kv-transfer-config", kv_config("kv_consumer")]) as d,
    ):
        for seeds in ((3, 4, 5), (6, 7, 8)):
            gaps = asyncio.run(_gaps_around(d.port, _pd_bursts(p.url, seeds), window_s=1.0))
            rounds.append(", ".join(f"{1e3 * b:.1f} -> {1e3 * a:.1f} ms" for b, a in gaps))
            # the decode steps themselves grow by ~2 ms while the 30K-token context decodes (its KV is read)
            if max(a - b for b, a in gaps) <= 0.040:
                break
        else:
            pytest.fail(f"the worst gap grew by over 40 ms in both rounds: {' | '.join(rounds)}")
    print("worst gap before -> after a 30K-token prompt came:", " | ".join(rounds))

"""Traffic capture: off by default; on, one Mooncake trace line per request that pdfleet.bench.trace
reads back (lengths, class, effective tokens, shared prefixes as shared ids), never a word of a prompt
or a completion; the file is 0600 and rotated within its bounds."""

from __future__ import annotations

import asyncio
import random
import stat
import time
from pathlib import Path

from pdfleet.bench.trace import read_trace
from pdfleet.bench.workloads import WorkloadSpec, build
from tests.unit.gateway.helpers import LONG, Env, chat, run

SECRET_PROMPT = "zebraprompt"
SECRET_COMPLETION = "zebracompletion"


def test_capture_is_off_by_default(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Env(tmp_path) as env:
            assert (await env.post("/v1/chat/completions", chat()))[0] == 200
            assert not env.gw.gateway.capture.on  # type: ignore[union-attr]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["keys.yaml", "policy.yaml"]

    run(scenario())


def test_captured_lines_are_shape_only_and_read_back_as_a_trace(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Env(tmp_path, stage="off", capture={"path": "capture.jsonl"}) as env:
            env.colo.name = SECRET_COMPLETION  # every answer carries it (served_by)
            shared = f"{LONG} {SECRET_PROMPT} "
            for i, stream in enumerate((True, False, True)):
                body = chat(shared + f"turn {i}", stream=stream, max_tokens=5 + i)
                assert (await env.post("/v1/chat/completions", body))[0] == 200
            assert (await env.post("/v1/completions", {"model": "llama", "prompt": SECRET_PROMPT}))[0] == 200

    run(scenario())
    path = tmp_path / "capture.jsonl"
    text = path.read_text()
    assert SECRET_PROMPT not in text and SECRET_COMPLETION not in text and "word" not in text
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    a, b, c, d = read_trace(path)
    assert [r.output_length for r in (a, b, c)] == [5, 6, 7]  # streamed events, usage, events
    assert a.length_class == "long" and d.length_class == "short" and a.model == "llama"
    assert a.input_length >= 1500 and a.effective_tokens == a.input_length
    assert len(a.hash_ids) == a.input_length // 512 and a.hash_ids == b.hash_ids == c.hash_ids
    assert a.hash_ids[0] == 0  # remapped ids in order of first sight, not the gateway's hashes
    assert a.timestamp <= b.timestamp <= c.timestamp <= d.timestamp


def test_the_capture_rotates_within_its_bounds(tmp_path: Path) -> None:
    async def scenario() -> None:
        capture = {"path": "c.jsonl", "max_bytes": 4096, "files": 2}
        async with Env(tmp_path, capture=capture) as env:
            for _ in range(60):
                assert (await env.post("/v1/chat/completions", chat(max_tokens=1)))[0] == 200

    run(scenario())
    files = sorted(p.name for p in tmp_path.glob("c.jsonl*"))
    assert files == ["c.jsonl", "c.jsonl.1"]
    for name in files:
        path = tmp_path / name
        assert path.stat().st_size <= 4096 and stat.S_IMODE(path.stat().st_mode) == 0o600
        assert read_trace(path)


def test_a_capture_replays_with_its_lengths_and_arrival_rate(tmp_path: Path) -> None:
    """The bench's trace workload built from a capture: the same prompt lengths (by the same estimate) and
    the arrival times of the requests as sent, so the rate is within 5%."""
    sent: list[tuple[float, int]] = []

    async def scenario() -> None:
        async with Env(tmp_path, capture={"path": "c.jsonl"}) as env:
            rng = random.Random(7)
            t0 = time.perf_counter()
            for _ in range(20):
                tokens = rng.randint(10, 3000)
                body = {"model": "llama", "prompt": "abcd" * tokens, "max_tokens": 2}
                sent.append((time.perf_counter() - t0, tokens))
                assert (await env.post("/v1/completions", body))[0] == 200
                await asyncio.sleep(rng.uniform(0.01, 0.08))

    run(scenario())
    items = build(WorkloadSpec("trace", dataset=str(tmp_path / "c.jsonl")), 100, 0)
    assert sorted(it.prompt_tokens for it in items) == sorted(t for _, t in sent)
    assert [it.prompt_tokens for it in items] == [t for _, t in sent]  # in arrival order
    span_sent = sent[-1][0] - sent[0][0]
    span_replayed = (items[-1].at or 0.0) - (items[0].at or 0.0)
    assert abs(span_replayed - span_sent) <= 0.05 * span_sent

"""Workloads: seeded and equal for equal seeds, lengths as asked, ShareGPT's filter, Mooncake traces with
prefix reuse, shared prefixes, and clear errors for bad options and files; synthetic prompts count as the
intended tokens; completion bodies ask for what the benches need."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdfleet.bench.workloads import (
    SIM_MODEL,
    WorkloadSpec,
    build,
    completion_body,
    estimate_tokens,
    synthetic_prompt,
)
from pdfleet.errors import ValidationError
from pdfleet.gateway.policy import length_class
from pdfleet.tokens import make_counter


def test_same_seed_same_requests_other_seed_others() -> None:
    spec = WorkloadSpec("long-prompt-mix", long_share=0.2)
    assert build(spec, 50, 7) == build(spec, 50, 7)
    assert build(spec, 50, 7) != build(spec, 50, 8)


def test_random_lengths_fixed_or_ranged_and_counted_as_the_simulator_counts() -> None:
    fixed = build(WorkloadSpec("random", input_len=100, output_len=20), 5, 0)
    assert {(it.prompt_tokens, it.output_tokens) for it in fixed} == {(100, 20)}
    assert all(estimate_tokens(it.prompt) == 100 for it in fixed)
    ranged = build(WorkloadSpec("random", input_len=100, output_len=20, range_ratio=0.5), 200, 0)
    assert min(it.prompt_tokens for it in ranged) >= 50 and max(it.prompt_tokens for it in ranged) <= 150
    assert len({it.prompt[:40] for it in ranged}) > 150  # random words: no shared prefix


def test_long_prompt_mix_has_the_share_of_long_documents() -> None:
    items = build(WorkloadSpec("long-prompt-mix", long_share=0.1), 1000, 1)
    longs = [it for it in items if length_class(it.prompt_tokens, 8192) == "long"]
    assert 60 <= len(longs) <= 140
    assert all(16000 <= it.prompt_tokens <= 30000 for it in longs)
    assert all(512 <= it.prompt_tokens <= 1536 for it in items if it not in longs)  # input_len 1024 ± 50%


def test_prefix_repetition_shares_prefixes() -> None:
    items = build(WorkloadSpec("prefix-repetition", prefix_len=50, suffix_len=10, num_prefixes=3), 9, 0)
    prefixes = {it.prompt[: 4 * 50 - 1] for it in items}
    assert len(prefixes) == 3 and all(it.prompt_tokens == 60 for it in items)


def test_agentic_sessions_grow_turn_by_turn_on_their_own_history() -> None:
    spec = WorkloadSpec("agentic", output_len=64)
    items = build(spec, 300, 3)
    assert items == build(spec, 300, 3) and [it.index for it in items] == list(range(300))
    assert [it.at for it in items] == sorted(it.at or 0.0 for it in items)
    sessions: dict[str, list] = {}
    for it in items:
        assert it.session is not None and estimate_tokens(it.prompt) == it.prompt_tokens
        sessions.setdefault(it.session, []).append(it)
    assert len(sessions) >= 300 // 20
    for turns in sessions.values():
        first = turns[0]
        assert 8192 <= first.prompt_tokens <= 16384
        for before, after in zip(turns, turns[1:], strict=False):
            assert after.prompt.startswith(before.prompt + " ")  # the whole history is the prefix
            assert 100 <= after.prompt_tokens - before.prompt_tokens <= 800
            assert (after.at or 0) - (before.at or 0) >= 1.0  # at least the tool-call pause
        assert len(turns) <= 20
    firsts = {turns[0].prompt[:200] for turns in sessions.values()}
    assert len(firsts) == len(sessions)  # no two sessions share a prefix


def test_sharegpt_first_turns_through_vllms_filter(tmp_path: Path) -> None:
    data = [
        {"conversations": [{"from": "human", "value": "q" * 400}, {"from": "gpt", "value": "a" * 800}]},
        {
            "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "a" * 800}]
        },  # prompt < 4
        {
            "conversations": [{"from": "human", "value": "q" * 5000}, {"from": "gpt", "value": "a" * 40}]
        },  # > 1024
        {"conversations": [{"from": "human", "value": "only one turn"}]},
    ]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(data))
    items = build(WorkloadSpec("sharegpt", dataset=str(path)), 3, 0)
    assert {(it.prompt_tokens, it.output_tokens) for it in items} == {(100, 200)}


def test_mooncake_trace_keeps_times_lengths_and_prefix_blocks(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 1000, "input_length": 600, "output_length": 10, "hash_ids": [7, 8]},
        {"timestamp": 1500, "input_length": 700, "output_length": 20, "hash_ids": [7, 9]},
    ]
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    a, b = build(WorkloadSpec("trace", dataset=str(path)), 10, 0)
    assert (a.at, b.at) == (0.0, 0.5) and (a.prompt_tokens, b.output_tokens) == (600, 20)
    assert a.prompt[: 512 * 4 - 1] == b.prompt[: 512 * 4 - 1]  # hash_id 7: the same first block
    assert estimate_tokens(a.prompt) == 600


@pytest.mark.parametrize(
    ("spec", "text", "message"),
    [
        (WorkloadSpec("nope"), None, "not a workload; choose one of random, long-prompt-mix"),
        (WorkloadSpec("sharegpt"), None, "--workload sharegpt needs --dataset PATH"),
        (WorkloadSpec("random", range_ratio=1.5), None, "--range-ratio 1.5"),
        (WorkloadSpec("trace"), '{"timestamp": 1, "output_length": 3}\n', ":1: input_length: required key"),
        (WorkloadSpec("trace"), "not json\n", ":1: not a JSON line"),
        (WorkloadSpec("sharegpt"), "{}", "a ShareGPT file is a JSON list"),
    ],
)
def test_bad_options_and_files_are_clear_errors(
    tmp_path: Path, spec: WorkloadSpec, text: str | None, message: str
) -> None:
    if text is not None:
        (tmp_path / "d").write_text(text)
        spec = WorkloadSpec(spec.name, dataset=str(tmp_path / "d"))
    with pytest.raises(ValidationError, match=message.replace("[", r"\[")):
        build(spec, 3, 0)


def test_a_missing_file_names_it_under_the_option_that_gives_it(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=f"--trace {tmp_path / 'nope.jsonl'}: cannot read the file"):
        build(WorkloadSpec("trace", dataset=str(tmp_path / "nope.jsonl")), 3, 0)
    with pytest.raises(ValidationError, match=f"--dataset {tmp_path / 'nope.json'}: cannot read the file"):
        build(WorkloadSpec("sharegpt", dataset=str(tmp_path / "nope.json")), 3, 0)


def test_a_synthetic_prompt_counts_as_its_tokens() -> None:
    """The simulator's and the gateway's estimate (no tokenizer) counts exactly `tokens`."""
    counter = make_counter(None)
    for tokens in (1, 128, 1024, 30000):
        assert counter.count(synthetic_prompt(tokens)) == tokens
    assert set(synthetic_prompt(3, "b")) == {"b"}


def test_a_streaming_body_ignores_eos() -> None:
    """Streaming, exactly max_tokens long, for the simulator's model unless told otherwise."""
    body = completion_body("xxxx", 256)
    assert body == {
        "model": SIM_MODEL,
        "prompt": "xxxx",
        "max_tokens": 256,
        "ignore_eos": True,
        "stream": True,
    }


def test_a_plain_body_leaves_the_flags_out() -> None:
    """stream=False, ignore_eos=False: the keys are absent (the server's defaults); no usage option either."""
    body = completion_body("x", 4, model="m", stream=False, ignore_eos=False, usage=True)
    assert body == {"model": "m", "prompt": "x", "max_tokens": 4}


def test_usage_asks_for_the_final_usage_event_as_vllm_bench_serve_does() -> None:
    """usage=True: `stream_options.include_usage` beside ignore_eos and stream (the random dataset's)."""
    body = completion_body("p", 3, "m", usage=True)
    assert body == {
        "model": "m",
        "prompt": "p",
        "max_tokens": 3,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }

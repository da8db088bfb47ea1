"""The router-policy benchmark: exact-length prompts, paired differences, rows, report, a tiny real run."""

from __future__ import annotations

import math

import pytest

from pdfleet.bench.router_policy import (
    BASELINE,
    DIRECT,
    PolicyConfig,
    Target,
    paired_added,
    path_of,
    policy_flags,
    prompt_text,
    report_lines,
    request_body,
    run_benchmark,
    summary,
)
from pdfleet.tokens import CharEstimate

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py

NAN = float("nan")


def test_prompts_have_the_class_length_and_never_share_a_prefix() -> None:
    a, b = prompt_text(23000, 1), prompt_text(23000, 2)
    assert CharEstimate().count(a) == CharEstimate().count(b) == 23000  # what the simulator counts
    assert prompt_text(23000, 1) == a  # seeded: a rerun sends the same prompts
    assert a[:16] != b[:16] and set(a) <= set("abcdefghijklmnopqrstuvwxyz ")
    assert CharEstimate().count(prompt_text(500, 3)) == 500


def test_request_body_per_endpoint() -> None:
    chat = PolicyConfig(policies=(BASELINE,), endpoint="chat", max_tokens=7)
    body = request_body(chat, "hello", {"kv_transfer_params": {"x": 1}}, stream=False)
    assert body["messages"] == [{"role": "user", "content": "hello"}] and "prompt" not in body
    assert (body["max_tokens"], body["stream"], body["kv_transfer_params"]) == (7, False, {"x": 1})
    assert path_of(chat) == "/v1/chat/completions"
    plain = PolicyConfig(policies=(BASELINE,))
    assert request_body(plain, "hi")["prompt"] == "hi" and path_of(plain) == "/v1/completions"


def test_paired_added_drops_rounds_where_either_side_failed() -> None:
    assert paired_added([0.30, NAN, 0.25, 0.20], [0.10, 0.10, NAN, 0.15]) == pytest.approx([0.05, 0.20])
    with pytest.raises(ValueError):
        paired_added([0.1], [0.1, 0.2])  # rounds must line up


def test_summary_rows_pair_each_target_with_round_robin() -> None:
    cfg = PolicyConfig(policies=(BASELINE, "cache_aware"), classes=(("long", 100),), rounds=4)
    rr = Target(BASELINE, "http://127.0.0.1:1", 1, {"long": [0.10, 0.12, 0.11, 0.10]}, {"long": 0.004})
    ca = Target("cache_aware", "http://127.0.0.1:2", 2, {"long": [0.13, 0.15, NAN, 0.16]}, {"long": 0.120})
    direct = Target(DIRECT, None, None, {"long": [0.09, 0.11, 0.10, 0.10]})
    rows = {r["target"]: r for r in summary([rr, ca, direct], cfg)}
    assert rows[BASELINE]["added_p50_ms"] == 0.0 and rows[BASELINE]["router_cpu_ms"] == pytest.approx(1.0)
    row = rows["cache_aware"]
    assert (row["samples"], row["failed"]) == (3, 1)
    # p90 of +30, +30, +60 interpolated as numpy does: 30 + 0.8 x 30
    assert row["added_p50_ms"] == pytest.approx(30.0) and row["added_p90_ms"] == pytest.approx(54.0)
    assert row["added_p50_first_half_ms"] == pytest.approx(30.0)  # rounds 1-2: +30, +30
    assert row["added_p50_second_half_ms"] == pytest.approx(60.0)  # round 3 failed; round 4: +60
    assert row["router_cpu_ms"] == pytest.approx(30.0) and row["ttft_p50_ms"] == pytest.approx(150.0)
    assert math.isnan(rows[DIRECT]["router_cpu_ms"]) and rows[DIRECT]["added_p50_ms"] == pytest.approx(-10.0)
    text = "\n".join(report_lines(list(rows.values()), cfg))
    assert "| cache_aware | 3 | 1 | 150.0 | +30.0 | +54.0 | +30.0 / +60.0 | 30.0 |" in text
    assert "cheapest first: round_robin 1.0, cache_aware 30.0" in text


def test_baseline_is_required() -> None:
    with pytest.raises(ValueError, match="round_robin"):
        run_benchmark(PolicyConfig(policies=("cache_aware",)))


def test_a_tiny_run_through_real_routers_and_simulators() -> None:
    """Every target answers every request: the real vllm-router per policy over a simulator pair."""
    cfg = PolicyConfig(
        policies=(BASELINE, "cache_aware", "kv_aware/round_robin"),
        classes=(("long", 3000), ("short", 50)),
        rounds=2,
        warmup=0,
    )
    rows = run_benchmark(cfg)
    assert {(r["class"], r["target"]) for r in rows} == {
        (c, t) for c in ("long", "short") for t in (BASELINE, "cache_aware", "kv_aware/round_robin", DIRECT)
    }
    assert all(r["samples"] == 2 and r["failed"] == 0 and r["ttft_p50_ms"] > 0 for r in rows)


def test_policy_flags_one_for_both_pools_or_one_per_pool() -> None:
    assert policy_flags("cache_aware") == ["--policy", "cache_aware"]
    assert policy_flags("random/random") == ["--policy", "random"]
    assert policy_flags("cache_aware/round_robin") == [
        "--prefill-policy",
        "cache_aware",
        "--decode-policy",
        "round_robin",
    ]

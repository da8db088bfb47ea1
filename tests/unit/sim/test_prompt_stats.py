"""Prompt tokens counted once per request, whole, split by where they came from (vLLM's IterationStats and
0.33's PromptTokenStats)."""

from __future__ import annotations

from pdfleet.sim.prompt_stats import SOURCES, PromptTokens


def test_a_request_counts_its_whole_prompt_split_by_source() -> None:
    computed: list[int] = []
    stats = PromptTokens(observer=computed.append)
    assert stats.first_token(1004, 0, 1003) == 1  # a decode instance: the KV came over the transfer
    assert stats.first_token(100, 64, 0) == 36  # a local prefix-cache hit
    assert stats.total == 1104 and stats.cached == 1067
    assert stats.by_source == {"local_compute": 37, "local_cache_hit": 64, "external_kv_transfer": 1003}
    assert computed == [1, 36]  # vllm:request_prefill_kv_computed_tokens observes each request
    assert tuple(stats.by_source) == SOURCES


def test_sources_never_exceed_the_prompt() -> None:
    stats = PromptTokens()
    assert stats.first_token(10, 16, 5) == 0  # a hit rounded up to a block is still the prompt
    assert stats.total == 10 and stats.by_source["external_kv_transfer"] == 0

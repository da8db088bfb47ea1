"""Prompt-token counters as vLLM's stat logger keeps them: each request's whole prompt once, when its first
token is out, split by where the tokens came from.

vLLM counts `vllm:prompt_tokens` from `IterationStats` at a request's first token (`is_prefilling`), the
whole prompt including what the prefix cache or a KV transfer supplied; 0.33 splits the same total by
source (`PromptTokenStats.ALL_SOURCES`: local_compute, local_cache_hit, external_kv_transfer) and counts the
cached part apart (`vllm:prompt_tokens_cached`). A decode instance of a P/D pair therefore counts the
prompt it received, not only the one token it computed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")


@dataclass
class PromptTokens:
    """The counters, in tokens, summed over every request that produced its first token."""

    by_source: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SOURCES, 0))
    # vllm:request_prefill_kv_computed_tokens: told each request's prompt tokens computed here
    observer: Callable[[int], None] | None = None

    @property
    def total(self) -> int:
        """vllm:prompt_tokens: every prompt token of every request, counted once."""
        return sum(self.by_source.values())

    @property
    def cached(self) -> int:
        """vllm:prompt_tokens_cached: the prompt tokens not computed here (cache hit or KV transfer)."""
        return self.by_source["local_cache_hit"] + self.by_source["external_kv_transfer"]

    def first_token(self, prompt: int, local_hit: int, external: int) -> int:
        """Count one request's prompt at its first token; returns the tokens it computed here."""
        local_hit = min(local_hit, prompt)
        external = min(external, prompt - local_hit)
        computed = prompt - local_hit - external
        self.by_source["local_compute"] += computed
        self.by_source["local_cache_hit"] += local_hit
        self.by_source["external_kv_transfer"] += external
        if self.observer is not None:
            self.observer(computed)
        return computed

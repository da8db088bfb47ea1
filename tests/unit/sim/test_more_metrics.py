"""The families beyond the request chain: vLLM's label values, values from the engine's counters, and
only where the modelled release registers them."""

from __future__ import annotations

from pdfleet.model.vllm_release_data import RELEASES
from pdfleet.sim.config import parse_serve_args
from pdfleet.sim.more_metrics import families
from tests.unit.sim.helpers import MODEL

LABELS = {"model_name": MODEL, "engine": "0"}


def _samples(version: str, consumer: bool) -> dict[str, dict[str, float]]:
    engine = parse_serve_args([MODEL, "--sim-vllm-version", version], env={}).engine()
    engine.prompt.first_token(1004, 0, 1003)  # a decode request whose KV came over the transfer
    engine.prompt.first_token(100, 64, 0)  # a local prefix-cache hit
    out: dict[str, dict[str, float]] = {}
    for fam in families(RELEASES[version], engine, LABELS, consumer):
        extra = [k for k in fam.samples[0].labels if k not in LABELS]  # type: ignore[attr-defined]
        out[fam.name] = {  # type: ignore[attr-defined]
            (s.labels[extra[0]] if extra else ""): s.value
            for s in fam.samples  # type: ignore[attr-defined]
        }
    return out


def test_0_33_prompt_tokens_by_source_and_the_consumer_s_fetch_stages() -> None:
    got = _samples("0.33.0", consumer=True)
    assert got["vllm:prompt_tokens_by_source"] == {
        "local_compute": 37,
        "local_cache_hit": 64,
        "external_kv_transfer": 1003,
    }
    assert got["vllm:prompt_tokens_cached"] == {"": 1067}
    assert got["vllm:prompt_tokens_cached_by_source"]["device"] == 64
    assert got["vllm:external_prefix_cache_hits"] == {"": 1003}
    assert set(got["vllm:num_requests_waiting_by_reason"]) == {"capacity", "deferred"}
    assert set(got["vllm:num_requests_kv_fetch_by_stage"]) == {
        "waiting_to_start",
        "in_progress",
        "completed_waiting",
    }
    assert got["vllm:engine_sleep_state"] == {"awake": 1.0, "weights_offloaded": 0.0, "discard_all": 0.0}
    assert "vllm:num_requests_kv_fetch_by_stage" not in _samples("0.33.0", consumer=False)


def test_0_11_registers_none_of_them() -> None:
    assert _samples("0.11.0", consumer=True) == {}

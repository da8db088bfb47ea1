"""Metric registrations read from excerpts of vLLM's stat logger and NIXL stats: names, types, labels,
the conditions they are registered under, and histogram bounds as the registering function builds them."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from tools import vllm_extract as ex
from tools import vllm_metrics
from tools.vllm_ast import Sources

FIXTURES = Path(__file__).resolve().parent / "fixtures"
LATENCY = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
TTFT = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)


def metrics(version: str) -> dict[str, Any]:
    src = Sources.from_dir(FIXTURES / f"vllm-{version}", version)
    nixl = ex.connector_files(src, ex.registry(src), ex.NIXL)
    mooncake = ex.connector_files(src, ex.registry(src), ex.MOONCAKE)
    return {m.name: m for m in vllm_metrics.metrics(src, nixl, mooncake)}


def test_0_11_stat_logger_metrics() -> None:
    found = metrics("0.11.0")
    assert found["vllm:time_to_first_token_seconds"].buckets == TTFT  # a literal list
    queue = found["vllm:request_queue_time_seconds"]
    assert queue.kind == "histogram" and queue.buckets == LATENCY  # a list bound to a name first
    prompt = found["vllm:request_prompt_tokens"]
    assert prompt.buckets is None and prompt.buckets_rule == "build_1_2_5_buckets(max_model_len)"
    assert found["vllm:request_success"].labels == ("model_name", "engine", "finished_reason")
    assert found["vllm:num_preemptions"].kind == "counter" and found["vllm:num_preemptions"].when is None
    assert found["vllm:gpu_cache_usage_perc"].when == "self.show_hidden_metrics"
    assert not [name for name in found if name.startswith("vllm:nixl_")]


def test_0_33_bucket_families_and_nixl_metrics() -> None:
    found = metrics("0.33.0")
    # histogram_buckets("request_latency") -> buckets.py's REQUEST_LATENCY_BUCKETS
    assert found["vllm:request_queue_time_seconds"].buckets == LATENCY
    assert found["vllm:time_to_first_token_seconds"].buckets == TTFT
    assert found["vllm:request_prompt_tokens"].buckets_rule == "build_1_2_5_buckets(max_model_len)"
    lifetime = found["vllm:kv_block_lifetime_seconds"]
    assert lifetime.when == "self.kv_cache_metrics_enabled" and lifetime.buckets[-1] == 1800
    xfer = found["vllm:nixl_xfer_time_seconds"]
    assert xfer.buckets[0] == 0.005 and xfer.buckets[-1] == 5.0  # buckets[1:] of the post-time list
    assert found["vllm:nixl_post_time_seconds"].buckets[0] == 0.001
    assert found["vllm:nixl_bytes_transferred"].buckets == tuple(2**e for e in range(11, 34, 2))
    assert found["vllm:nixl_num_descriptors"].buckets == (
        10,
        20,
        30,
        50,
        75,
        100,
        200,
        400,
        1000,
        2000,
        4000,
        10000,
        20000,
        50000,
    )
    assert found["vllm:nixl_num_kv_expired_reqs"].kind == "counter"
    # the stat logger's labelnames, handed to the connector's metrics
    assert found["vllm:nixl_num_kv_expired_reqs"].labels == ("model_name", "engine")
    assert len([name for name in found if name.startswith("vllm:nixl_")]) == 8


def test_0_33_mooncake_metrics_module_buckets_and_counting_rules() -> None:
    """MooncakeConnector's six metrics (module-level bucket tuples, a `tuple(genexp)` among them), and what
    each connector counter adds up: 0.33's nixl_num_failed_transfers counts handshake and notification
    failures too (issue 25 items 3, 4)."""
    found = metrics("0.33.0")
    mooncake = sorted(n for n in found if n.startswith("vllm:mooncake_"))
    assert [n.removeprefix("vllm:mooncake_") for n in mooncake] == [
        "bytes_transferred",
        "num_descriptors",
        "num_failed_recvs",
        "num_failed_transfers",
        "num_kv_expired_reqs",
        "xfer_time_seconds",
    ]
    xfer = found["vllm:mooncake_xfer_time_seconds"]
    assert xfer.kind == "histogram" and xfer.buckets[0] == 0.005 and xfer.buckets[-1] == 5.0
    assert found["vllm:mooncake_bytes_transferred"].buckets == tuple(2**e for e in range(11, 34, 2))
    assert found["vllm:mooncake_num_failed_recvs"].counts == ("num_failed_recvs",)
    assert found["vllm:nixl_num_failed_transfers"].counts == (
        "num_failed_transfers",
        "num_failed_handshakes",
        "num_failed_notifications",
    )
    assert found["vllm:nixl_num_failed_notifications"].counts == ("num_failed_notifications",)
    assert found["vllm:time_to_first_token_seconds"].counts == ()  # not a connector counter


@pytest.mark.parametrize(
    ("version", "reasons", "fields"),
    [
        # 0.11.0's excerpt: four CacheConfig fields, then swap_space_bytes its __post_init__ sets
        (
            "0.11.0",
            ("stop", "length", "abort"),
            (
                "block_size",
                "cache_dtype",
                "enable_prefix_caching",
                "prefix_caching_hash_algo",
                "swap_space_bytes",
            ),
        ),
        ("0.33.0", ("stop", "length", "abort", "error", "repetition"), ("block_size", "cache_dtype")),
    ],
)
def test_finished_reason_values_and_the_cache_config_info_gauge(
    version: str, reasons: tuple[str, ...], fields: tuple[str, ...]
) -> None:
    """request_success has a series per FinishReason from the start (0.33 adds error and repetition), and
    the cache_config_info gauge, named by a local and labelled with metrics_info().keys(), is tabled with
    CacheConfig's attributes and engine as its labels (issue 25: the extractor missed both)."""
    found = metrics(version)
    assert found["vllm:request_success"].label_values == (("finished_reason", reasons),)
    info = found["vllm:cache_config_info"]
    assert (info.kind, info.when, info.label_values) == ("gauge", None, ())
    assert info.labels[: len(fields)] == fields and info.labels[-1] == "engine", info.labels
    assert "DEFAULT_BLOCK_SIZE" not in info.labels  # a ClassVar is not in __dict__


def test_every_other_family_a_file_declares_is_named_and_nothing_else() -> None:
    """Issue 25 (the generator's blind spots): the families outside the stat logger and NIXL/Mooncake stats,
    each with its file: names passed to a registration call (sleep mode's positional names), bound to class
    attributes (tiering's name constants), items of a name list (spec decoding's), not the PromQL in a
    docstring, a name compared against (reader.py) or a prefix tested; a name a `metrics` row holds is not
    repeated."""
    src = Sources.from_dir(FIXTURES / "vllm-0.33.0", "0.33.0")
    others = {o.source: o.names for o in vllm_metrics.other_metrics(src, list(metrics("0.33.0").values()))}
    assert others["vllm/entrypoints/serve/dev/sleep/metrics.py"] == (
        "vllm:sleep_mode_operation_duration_seconds",
        "vllm:sleep_mode_operations_in_flight",
    )
    tiering = others["vllm/v1/kv_offload/tiering/base.py"]
    assert len(tiering) == 19 and "vllm:kv_offload_tiering_promotion_allocation_failures" in tiering
    assert others["vllm/v1/spec_decode/metrics.py"] == (
        "vllm:diffusion_num_canvas_positions",
        "vllm:diffusion_num_committed_tokens",
        "vllm:diffusion_num_denoising_steps",
        "vllm:spec_decode_num_accepted_tokens",
        "vllm:spec_decode_num_accepted_tokens_per_pos",
        "vllm:spec_decode_num_draft_tokens",
        "vllm:spec_decode_num_drafts",
    )
    assert "vllm/v1/metrics/reader.py" not in others  # `metric.name == "vllm:..."`, `startswith("vllm:")`
    tabled = {n for names in others.values() for n in names}
    assert not tabled & set(metrics("0.33.0"))  # the stat logger's and connectors' stay in `metrics` only
    lines = (
        "if line.startswith('vllm:spec_decode') or name == 'vllm:a':",
        "    pass",
        "'vllm:b'",
        "f'vllm:c{x}'",
    )
    assert vllm_metrics.declared_names(ast.parse("\n".join(lines))) == set()

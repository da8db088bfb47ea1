"""The questions rendering, checks and the simulator ask of a pinned release, answered from its row."""

from __future__ import annotations

import dataclasses

import pytest

from pdfleet.model.vllm_release_data import RELEASES
from pdfleet.model.vllm_releases import find_release, version_key

OLD, NEW = RELEASES["0.11.0"], RELEASES["0.33.0"]


def test_side_channel_ports_per_instance() -> None:
    # 0.11: every TP rank binds base + dp_rank * tp + tp_rank, so TP=2 on one host takes two ports
    assert OLD.side_channel_ports(5557, tensor_parallel_size=2) == (5557, 5558)
    assert OLD.side_channel_ports(5557, tensor_parallel_size=2, dp_rank=1) == (5559, 5560)
    # 0.33: one listener per engine at base + data_parallel_index
    assert NEW.side_channel_ports(5600, tensor_parallel_size=4) == (5600,)
    assert NEW.side_channel_ports(5600, tensor_parallel_size=4, dp_rank=1) == (5601,)


def test_kv_hold_is_a_timeout_then_a_lease() -> None:
    assert OLD.kv_hold_s() == ("timeout", 120.0)
    assert NEW.kv_hold_s() == ("lease", 30.0)


def test_lease_timing() -> None:
    assert OLD.lease_timing() is None
    assert NEW.lease_timing() == (30.0, 5.0, 20.0)  # 30 s lease, heartbeat every 30 // 6, +30 * 2 // 3
    assert NEW.lease_timing(60) == (60.0, 10.0, 40.0)


def test_env_and_extra_config_lookups() -> None:
    assert OLD.env_default("VLLM_NIXL_SIDE_CHANNEL_PORT") == 5557
    assert NEW.env_default("VLLM_MOONCAKE_BOOTSTRAP_PORT") == 8998
    with pytest.raises(KeyError, match="vLLM 0.33.0 has no VLLM_NIXL_ABORT_REQUEST_TIMEOUT"):
        NEW.env_default("VLLM_NIXL_ABORT_REQUEST_TIMEOUT")
    assert NEW.extra_default("MooncakeConnector", "num_workers") == 10
    with pytest.raises(KeyError, match="MooncakeConnector in vLLM 0.11.0 reads no"):
        OLD.extra_default("MooncakeConnector", "num_workers")


def test_buffer_devices_and_connectors() -> None:
    assert OLD.buffer_devices_on("cuda") == ("cuda",) and "cpu" in NEW.buffer_devices_on("cuda")
    assert NEW.buffer_devices_on("nosuch") == ()
    assert not OLD.has_connector("MooncakeConnector") and NEW.has_connector("MooncakeConnector")
    assert "kv_buffer_size" in OLD.config_keys() and "kv_buffer_size" not in NEW.config_keys()


def test_batch_tiers_by_gpu() -> None:
    assert (NEW.batch_tier(180).max_num_batched_tokens, NEW.batch_tier(180).max_num_seqs) == (16384, 1024)
    assert NEW.batch_tier(80, "NVIDIA H100 80GB HBM3").max_num_batched_tokens == 8192
    assert NEW.batch_tier(80, "NVIDIA A100-SXM4-80GB").max_num_seqs == 256  # A100 stays on the small tier
    assert OLD.batch_tier(180).max_num_batched_tokens == 8192  # 0.11 has no >= 160 GiB tier
    assert OLD.batch_tier(24).max_num_seqs == 256


def test_metric_lookups() -> None:
    assert NEW.metric("vllm:nixl_xfer_time_seconds").kind == "histogram"
    with pytest.raises(KeyError, match="vLLM 0.11.0 registers no metric vllm:nixl_xfer_time_seconds"):
        OLD.metric("vllm:nixl_xfer_time_seconds")
    assert "vllm:gpu_cache_usage_perc" not in OLD.metric_names()  # only with --show-hidden-metrics
    assert "vllm:gpu_cache_usage_perc" in OLD.metric_names(include_conditional=True)


def test_find_release_for_a_pin() -> None:
    table = {"0.11.0": OLD, "0.11.2": dataclasses.replace(OLD, version="0.11.2"), "0.33.0": NEW}
    assert find_release("0.33.0", table) is NEW
    assert find_release("0.11.2", table).version == "0.11.2"  # type: ignore[union-attr]
    assert find_release("0.11.1", table) is None  # never its minor's row: a patch can change the rules
    assert find_release("0.11.5", table) is None
    assert find_release("0.12.0", table) is None and find_release("latest", table) is None
    assert version_key("0.33.0") > version_key("0.9.2")

"""The profile schema: operator values, the side-channel port rule, immutability."""

from __future__ import annotations

import pytest

from pdfleet.model.profile_loader import load_profile
from tests.unit.model.helpers import PROFILES


def test_operator_values_for_prefill_and_decode() -> None:
    profile = load_profile("cross-rdma", PROFILES)
    assert profile.model.id == "meta-llama/Llama-3.1-8B-Instruct"
    assert profile.vllm.version == "0.11.0" and profile.kv_transfer.connector == "NixlConnector"
    prefill, decode = profile.pools.prefill, profile.pools.decode
    assert prefill is not None and decode is not None
    assert (prefill.port, prefill.max_num_batched_tokens, prefill.gpu_memory_utilization) == (
        8100,
        8192,
        0.85,
    )
    assert (decode.port, decode.max_num_batched_tokens, decode.gpu_memory_utilization) == (8200, 2048, 0.90)
    assert prefill.enable_chunked_prefill and decode.enable_chunked_prefill
    assert (prefill.kv_role, decode.kv_role) == ("kv_producer", "kv_consumer")
    assert profile.pools.colocated is not None and profile.pools.colocated.port == 8000  # the baseline
    assert profile.rdma.enabled and profile.topology == "cross-host"
    colocated = load_profile("colocated", PROFILES)
    assert colocated.pools.colocated is not None and colocated.pools.colocated.port == 8000
    assert colocated.kv_role_for("colocated") is None and colocated.side_channel_port_for("prefill") is None


def test_side_channel_port_rule() -> None:
    profile = load_profile("same-host-pcie", PROFILES)
    kv = profile.kv_transfer
    assert kv.side_channel_port_for("prefill") == kv.side_channel_port == 5600
    assert kv.side_channel_port_for("decode") == 5601
    assert kv.side_channel_port_for("colocated") is None
    assert kv.bootstrap_port_for("prefill") is None  # NixlConnector has no Mooncake bootstrap server


def test_models_are_immutable() -> None:
    profile = load_profile("colocated", PROFILES)
    with pytest.raises(Exception, match="frozen"):
        profile.topology = "same-host"  # type: ignore[misc]

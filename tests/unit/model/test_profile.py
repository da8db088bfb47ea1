"""The profile schema: operator values, the side-channel port rule, immutability, the router policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdfleet.errors import ValidationError
from pdfleet.model.profile import DEFAULT_ROUTER_POLICY, ROUTER_POLICIES
from pdfleet.model.profile_loader import load_profile
from pdfleet.model.vllm_release_data import NEWEST
from tests.unit.model.helpers import GOOD, PROFILES


def test_operator_values_for_prefill_and_decode() -> None:
    profile = load_profile("cross-rdma", PROFILES)
    assert profile.model.id == "meta-llama/Llama-3.1-8B-Instruct"
    assert profile.vllm.version == NEWEST == "0.33.0" and profile.kv_transfer.connector == "NixlConnector"
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
    assert colocated.side_channel_port_for("prefill") is None


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


def _with_router_policy(tmp_path: Path, value: str) -> Path:
    """A profile extending the known-good base with `gateway: {router_policy: VALUE}` (YAML flow text)."""
    (tmp_path / "_good.yml").write_text(GOOD)
    path = tmp_path / "rp.yml"
    path.write_text(f"extends: _good\ngateway: {{router_policy: {value}}}\n")
    return path


def test_router_policy_defaults_to_round_robin_for_both_pools() -> None:
    for name in ("cross-rdma", "same-host-pcie", "colocated", "lab-cross", "lab-same-host"):
        policy = load_profile(name, PROFILES).gateway.router_policy
        assert policy.prefill == policy.decode == DEFAULT_ROUTER_POLICY == "round_robin"


@pytest.mark.parametrize("name", ROUTER_POLICIES)
def test_router_policy_name_sets_both_pools(tmp_path: Path, name: str) -> None:
    _with_router_policy(tmp_path, name)
    policy = load_profile("rp", tmp_path).gateway.router_policy
    assert (policy.prefill, policy.decode) == (name, name)


def test_router_policy_per_pool_and_unset_pool_keeps_the_default(tmp_path: Path) -> None:
    _with_router_policy(tmp_path, "{prefill: cache_aware, decode: power_of_two}")
    policy = load_profile("rp", tmp_path).gateway.router_policy
    assert (policy.prefill, policy.decode) == ("cache_aware", "power_of_two")
    _with_router_policy(tmp_path, "{decode: random}")
    policy = load_profile("rp", tmp_path).gateway.router_policy
    assert (policy.prefill, policy.decode) == ("round_robin", "random")


@pytest.mark.parametrize(
    ("value", "key_path", "expected"),
    [
        ("round-robin", "gateway.router_policy", "did you mean round_robin? (got 'round-robin')"),
        # in the router's docs and its Rust enum, but its 0.1.17 command line refuses it
        ("rendezvous_hash", "gateway.router_policy", "not a policy vllm-router 0.1.17 accepts in P/D mode"),
        ("{prefill: cache-aware}", "gateway.router_policy.prefill", "did you mean cache_aware?"),
        ("{decod: x}", "gateway.router_policy.decod", "unknown key; allowed: prefill, decode"),
        ("3", "gateway.router_policy", "must be a policy name (both pools) or {prefill: NAME, decode: NAME}"),
        ("[random]", "gateway.router_policy", "must be a policy name"),
    ],
)
def test_bad_router_policy_is_named_with_the_choices(
    tmp_path: Path, value: str, key_path: str, expected: str
) -> None:
    path = _with_router_policy(tmp_path, value)
    with pytest.raises(ValidationError) as err:
        load_profile("rp", tmp_path)
    lines = [line for line in str(err.value).splitlines() if line.startswith(f"{path}: {key_path}: ")]
    assert lines and expected in lines[0], str(err.value)
    if "not a policy" in lines[0]:
        assert "one of: " + ", ".join(ROUTER_POLICIES) in lines[0]

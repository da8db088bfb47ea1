"""kv_transfer decisions and role: wheel per connector/driver, env file, Mooncake extra config."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

import roles.kv_transfer as role
from pdfleet.fleet.host_layout import KV_ENV_FILE
from pdfleet.hw import gpu_facts
from pdfleet.hw.kv import kv_connector_extra_config, kv_env, kv_requirement, render_env
from pdfleet.model.specs import KVTransferSpec
from pdfleet.ops.apt import AptPackage, AptUpdate
from pdfleet.ops.files import File
from pdfleet.ops.pip import PipRequirements
from tests.unit.hw.helpers import H100_DEVICES, context, fixture_facts, host, pinned, profile, run_role

H100 = "h100-sxm-8x-nvswitch-cx7"
MOONCAKE = {"connector": "MooncakeConnector"}


def env_of(ops):  # type: ignore[no-untyped-def]
    [f] = [op for op in ops if isinstance(op, File) and op.path == KV_ENV_FILE]
    text = f.content.decode() if isinstance(f.content, bytes) else f.content
    return f, dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def test_requirement_matches_driver_cuda() -> None:
    old = {"version": "0.11.0"}
    assert kv_requirement(profile("cross-rdma", vllm=old, gpu={"driver_branch": "570"})) == "nixl[cu12]"
    assert kv_requirement(profile("cross-rdma", vllm=old)) == "nixl[cu13]"  # R580 → CUDA 13
    # 0.33 checks NIXL >= 1.5.0 at worker start, and the cu12/cu13 extras no longer do anything
    assert kv_requirement(pinned()) == kv_requirement(profile("cross-rdma")) == "nixl>=1.5.0"
    assert kv_requirement(pinned(kv_transfer=MOONCAKE)) == "mooncake-transfer-engine"
    assert kv_requirement(profile("cross-rdma", kv_transfer=MOONCAKE)) == "mooncake-transfer-engine-cuda13"


def test_h100_nixl_env_has_ucx_devices_and_computed_gid() -> None:
    ctx = context(pinned(), host(groups=("prefill",)))
    ops, skips, _ = run_role(role, ctx, fixture_facts(H100))
    f, env = env_of(ops)
    assert f.mode == "0600"
    assert env == {
        "UCX_TLS": "all",
        "UCX_NET_DEVICES": ",".join(f"{d}:1" for d in H100_DEVICES),
        "UCX_IB_GID_INDEX": "3",
        "MC_GID_INDEX": "3",
    }
    assert [h.unit for h in f.notify] == ["vllm-prefill.service"]
    [pip] = [op for op in ops if isinstance(op, PipRequirements)]
    assert pip.requirements == ("nixl>=1.5.0",) and pip.venv == "/opt/pdfleet/venv"


def test_env_values_are_quoted_for_systemd() -> None:
    text = render_env({"UCX_TLS": "rc,ud,sm,^cuda_ipc", "UCX_IB_GID_INDEX": "3"})
    assert 'UCX_TLS="rc,ud,sm,^cuda_ipc"\n' in text and "UCX_IB_GID_INDEX=3\n" in text


def test_mooncake_prefill_gets_bootstrap_port_and_dmabuf_peermem_flag() -> None:
    prof = pinned(kv_transfer={**MOONCAKE, "ucx_tls": "rc,ud,sm,self"})
    ops, _, _ = run_role(role, context(prof, host(groups=("prefill",))), fixture_facts(H100))
    _, env = env_of(ops)
    assert env["VLLM_MOONCAKE_BOOTSTRAP_PORT"] == "8998" and env["WITH_NVIDIA_PEERMEM"] == "0"
    assert env["UCX_TLS"] == "rc,ud,sm,self"
    ops, _, _ = run_role(role, context(prof, host(groups=("decode",))), fixture_facts(H100))
    _, env = env_of(ops)
    assert "VLLM_MOONCAKE_BOOTSTRAP_PORT" not in env and env["MC_GID_INDEX"] == "3"


def test_mooncake_between_hosts_gets_a_transfer_timeout_and_over_tcp_the_queue_depth() -> None:
    rdma = kv_env(pinned(kv_transfer=MOONCAKE), host(groups=("decode",)), 3, "dmabuf", False)
    assert rdma["MC_TRANSFER_TIMEOUT"] == "10" and "MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER" not in rdma
    assert "UCX_TCP_USER_TIMEOUT" not in rdma  # NIXL's: Mooncake does not read UCX's settings
    lab = profile("lab-cross-mooncake")
    ops, _, _ = run_role(role, context(lab, host(rdma_devices=())), fixture_facts("lab-container"))
    env = env_of(ops)[1]
    assert env["MC_TRANSFER_TIMEOUT"] == "10" and env["MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER"] == "65535"
    same = pinned("same-host-pcie", kv_transfer={**MOONCAKE, "mooncake_protocol": "tcp"})
    h = host(groups=("prefill", "decode"), gpus=(0, 1), rdma_devices=(), rdma_netdev=None)
    assert not [k for k in kv_env(same, h, None, "dmabuf", True) if k.startswith("MC_T")]


def test_mooncake_with_peermem_when_proprietary_modules() -> None:
    prof = pinned(open_modules=False, kv_transfer=MOONCAKE)
    assert kv_env(prof, host(), 3, "peermem", False)["WITH_NVIDIA_PEERMEM"] == "1"
    ops, _, _ = run_role(role, context(prof, host()), fixture_facts(H100))
    assert env_of(ops)[1]["WITH_NVIDIA_PEERMEM"] == "1"


def test_same_host_uses_no_rdma() -> None:
    prof = pinned("same-host-pcie")
    h = host(groups=("prefill", "decode"), gpus=(0, 1), rdma_devices=(), rdma_netdev=None)
    ops, skips, _ = run_role(role, context(prof, h), fixture_facts("l40s-pcie-2x"))
    f, env = env_of(ops)
    assert env == {"UCX_TLS": "all"} and skips == []
    assert sorted(hd.unit for hd in f.notify) == ["vllm-decode.service", "vllm-prefill.service"]


def test_sim_engine_skips_the_wheel_with_reason_but_writes_env() -> None:
    prof = profile("cross-rdma", vllm={"engine": "sim"}, rdma={"enabled": False})
    ops, skips, changes = run_role(role, context(prof, host(rdma_devices=())), fixture_facts("lab-container"))
    assert [s.what for s in skips] == ["KV transfer library"] and "engine: sim" in skips[0].reason
    assert not any(isinstance(op, PipRequirements) for op in ops)
    # cross-host without RDMA: KV moves over UCX's TCP transport, whose timeouts turn a hang into an error
    assert env_of(ops)[1] == {"UCX_TLS": "all", "UCX_TCP_SYN_CNT": "2", "UCX_TCP_USER_TIMEOUT": "10s"}
    assert any(c.commands for c in changes)


def test_sim_library_installs_nixl_s_cpu_build_without_torch_and_pins_the_data_ports() -> None:
    kv = {"sim_library": True, "ucx_tls": "tcp", "ucx_tcp_port_range": "20100-20199"}
    prof = profile("lab-cross", kv_transfer=kv)
    ops, skips, _ = run_role(role, context(prof, host(rdma_devices=())), fixture_facts("lab-container"))
    pips = [(op.requirements, op.extra_args) for op in ops if isinstance(op, PipRequirements)]
    assert pips == [(("nixl-cu12==1.5.1",), ("--no-deps",)), (("numpy",), ())] and skips == []
    assert not any(isinstance(op, AptPackage) for op in ops)  # libibverbs1, libnuma1: Mooncake's
    assert all(
        op.venv == prof.vllm.venv and op.index_url == prof.mirrors.pypi
        for op in ops
        if isinstance(op, PipRequirements)
    )
    env = env_of(ops)[1]
    assert env["UCX_TLS"] == "tcp" and env["UCX_TCP_PORT_RANGE"] == "20100-20199"
    # the simulator moves each request's KV bytes through NIXL at the profile's fraction (sim.kv_library)
    assert env["PDFLEET_SIM_KV_LIBRARY"] == "nixl" and env["PDFLEET_SIM_KV_BYTES_FRACTION"] == "0.001"
    moon = profile("lab-cross", kv_transfer={**kv, "connector": "MooncakeConnector"})
    ops, _, _ = run_role(role, context(moon, host(rdma_devices=())), fixture_facts("lab-container"))
    [pip] = [op for op in ops if isinstance(op, PipRequirements)]
    assert pip.requirements == ("mooncake-transfer-engine-non-cuda==0.3.13.post1",) and pip.extra_args == ()
    # its engine.so links libibverbs.so.1 (even for tcp) and libnuma.so.1: Debian's packages, lists
    # refreshed when one is missing
    apt = [op.describe() for op in ops if isinstance(op, AptUpdate | AptPackage)]
    assert apt == ["apt-get update", "apt package libibverbs1", "apt package libnuma1"]
    assert "UCX_TCP_SYN_CNT" not in env_of(ops)[1]  # Mooncake's TCP transport is its own, not UCX's
    # the simulator moves its bytes through Mooncake's engine
    moon_env = env_of(ops)[1]
    assert (moon_env["PDFLEET_SIM_KV_LIBRARY"], moon_env["PDFLEET_SIM_KV_BYTES_FRACTION"]) == (
        "mooncake",
        "0.001",
    )


def test_the_sim_moves_no_bytes_without_the_library_and_refuses_a_fraction_out_of_range() -> None:
    prof = profile("lab-cross")
    ops, _, _ = run_role(role, context(prof, host(rdma_devices=())), fixture_facts("lab-container"))
    assert not any(key.startswith("PDFLEET_SIM_") for key in env_of(ops)[1])
    for bad in (0, 1.5):
        with pytest.raises(ValidationError, match="sim_bytes_fraction"):
            KVTransferSpec.model_validate({"sim_bytes_fraction": bad})


def test_a_port_range_out_of_order_is_refused_naming_it() -> None:
    with pytest.raises(ValidationError, match="ucx_tcp_port_range '20199-20100'"):
        KVTransferSpec.model_validate({"ucx_tcp_port_range": "20199-20100"})
    assert KVTransferSpec.model_validate({"ucx_tcp_port_range": "20100-20100"}).ucx_tcp_port_range


def test_gid_problem_is_a_skip_not_a_guess() -> None:
    ctx = context(pinned(), host(rdma_devices=("mlx5_7",)))
    ops, skips, _ = run_role(role, ctx, fixture_facts("driver-mismatch"))
    assert any("mlx5_7 port 1 is DOWN" in s.reason for s in skips)
    assert "UCX_IB_GID_INDEX" not in env_of(ops)[1]


def test_kv_connector_extra_config() -> None:
    h = host(rdma_devices=("mlx5_0", "mlx5_1"))
    assert kv_connector_extra_config(pinned(), h) == {}
    assert kv_connector_extra_config(pinned(kv_transfer=MOONCAKE), h) == {
        "mooncake_protocol": "rdma",
        "device_name": "mlx5_0,mlx5_1",
    }
    tcp = pinned(kv_transfer={**MOONCAKE, "mooncake_protocol": "tcp"})
    assert kv_connector_extra_config(tcp, h) == {"mooncake_protocol": "tcp"}


def test_applies_only_to_pd_hosts() -> None:
    assert role.applies(context(pinned(), host(groups=("decode",))))
    assert not role.applies(context(pinned("colocated"), host(groups=("colocated",))))
    assert not role.applies(context(pinned(), host(groups=("gateway",))))


def test_unused_fixture_fact_is_still_parsed() -> None:
    assert fixture_facts(H100).get(gpu_facts.KernelFact()).release == "6.1.0-31-amd64"

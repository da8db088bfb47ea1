"""The NIXL and Mooncake connector facts read from excerpts of their files in vLLM 0.11.0 and 0.33.0."""

from __future__ import annotations

import pytest

from tests.unit.tools.helpers import NIXL_011, NIXL_033, mooncake_files, nixl_files, sources
from tools import vllm_connectors as con
from tools.vllm_ast import Sources


@pytest.fixture(scope="module")
def old() -> Sources:
    return sources("0.11.0")


@pytest.fixture(scope="module")
def new() -> Sources:
    return sources("0.33.0")


def test_side_channel_ports(old: Sources, new: Sources) -> None:
    before = con.side_channel(old, nixl_files(old))
    assert before.listener_port == "base_port + tp_rank" and before.per_tp_rank
    assert before.dp_stride_is_tp_size and "tensor_parallel_size" in before.advertised_port
    after = con.side_channel(new, nixl_files(new))
    assert after.listener_port == "port" and not after.per_tp_rank and not after.dp_stride_is_tp_size
    assert after.advertised_port == (
        "envs.VLLM_NIXL_SIDE_CHANNEL_PORT + vllm_config.parallel_config.data_parallel_index"
    )
    assert after.source == f"{NIXL_033}/base_scheduler.py"


def test_buffer_devices(old: Sources, new: Sources) -> None:
    assert dict(con.buffer_devices(old, nixl_files(old)).by_platform)["cuda"] == ("cuda",)
    table = con.buffer_devices(new, nixl_files(new))
    assert dict(table.by_platform)["cuda"] == ("cuda", "cpu") and table.source == f"{NIXL_033}/utils.py"


def test_extra_config_keys_with_defaults(old: Sources, new: Sources) -> None:
    assert {k.name: k.default for k in con.extra_config(old, nixl_files(old)).keys} == {"backends": ("UCX",)}
    nixl = {k.name: k.default for k in con.extra_config(new, nixl_files(new)).keys}
    assert nixl["kv_lease_duration"] == 30 and nixl["enforce_handshake_compat"] is True
    assert nixl["decoder_kv_blocks_ttl"] == 480
    mooncake = con.extra_config(new, mooncake_files(new))
    assert {k.name: k.default for k in mooncake.keys} == {
        "device_name": "",
        "mooncake_protocol": "rdma",
        "num_workers": 10,
    }


def test_mooncake_protocol(old: Sources, new: Sources) -> None:
    assert mooncake_files(old) == []
    files = mooncake_files(new)
    protocol = con.mooncake_protocol(new, files)
    assert protocol.read == ("remote_bootstrap_addr", "remote_engine_id", "transfer_id")
    assert protocol.bootstrap_routes == (("POST", "/register"), ("GET", "/query"))
    assert protocol.bootstrap_schemas == (
        (
            "RegisterWorkerPayload",
            (
                ("engine_id", "EngineId"),
                ("dp_rank", "int"),
                ("tp_rank", "int"),
                ("pp_rank", "int"),
                ("addr", "WorkerAddr"),
            ),
        ),
        ("EngineEntry", (("engine_id", "EngineId"), ("worker_addr", "dict[int, dict[int, WorkerAddr]]"))),
    )
    assert protocol.sources == tuple(f for f in files if not f.endswith("/stats.py"))  # metrics only


def test_kv_transfer_params_protocol(old: Sources, new: Sources) -> None:
    before = con.kv_transfer_params(old, nixl_files(old))
    assert before.produced == (
        "do_remote_prefill",
        "do_remote_decode",
        "remote_block_ids",
        "remote_engine_id",
        "remote_host",
        "remote_port",
        "tp_size",
    )
    assert before.finish_statuses == ("FINISHED_LENGTH_CAPPED",) and before.block_ids_type == "list[int]"
    after = con.kv_transfer_params(new, nixl_files(new))
    assert "remote_request_id" in after.produced and "remote_blocks_expiry_time" in after.produced
    assert after.finish_statuses == ("FINISHED_LENGTH_CAPPED", "FINISHED_STOPPED")
    # NixlConnector = NixlPullConnector, whose scheduler is NixlPullConnectorScheduler
    assert after.source == f"{NIXL_033}/pull_scheduler.py"
    assert after.block_ids_type == "tuple[list[int], ...] | list[list[int]]"  # BlockIds, resolved


def test_lease_rules(old: Sources, new: Sources) -> None:
    assert con.lease(old, nixl_files(old)) == con.Lease(None, None, (NIXL_011,))
    after = con.lease(new, nixl_files(new))
    assert after.heartbeat_interval == "kv_lease_duration // 6"
    assert after.extension == "kv_lease_duration * 2 // 3"
    assert after.sources == (f"{NIXL_033}/base_scheduler.py", f"{NIXL_033}/base_worker.py")


def test_handshake(old: Sources, new: Sources) -> None:
    before = con.handshake(old, nixl_files(old))
    assert (before.connector_version, before.hash_factors, before.min_nixl) == (None, (), None)
    after = con.handshake(new, nixl_files(new))
    assert after.connector_version == 15 and after.min_nixl == "1.5.0"
    assert after.hash_factors[:2] == ("vllm_version", "nixl_connector_version")
    # issue 25 item 5: 0.11.0's handshake query waits without a bound and reports no load errors
    assert (before.receive_timeout_ms, before.reports_load_errors) == (None, False)
    assert (after.receive_timeout_ms, after.reports_load_errors) == (5000, True)

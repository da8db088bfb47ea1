"""Each fact read from small excerpts of vLLM 0.11.0's and 0.33.0's own files (tests/unit/tools/fixtures,
every file headed by its `source:` release and path), the way tools/vllm_facts.py reads a wheel."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tools import vllm_extract as ex
from tools.vllm_ast import Sources

FIXTURES = Path(__file__).resolve().parent / "fixtures"
NIXL_011 = "vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py"
NIXL_033 = "vllm/distributed/kv_transfer/kv_connector/v1/nixl"
MOONCAKE_033 = "vllm/distributed/kv_transfer/kv_connector/v1/mooncake"


def sources(version: str) -> Sources:
    """The excerpts of one release, keyed by their path inside the wheel."""
    return Sources.from_dir(FIXTURES / f"vllm-{version}", version)


@pytest.fixture(scope="module")
def old() -> Sources:
    return sources("0.11.0")


@pytest.fixture(scope="module")
def new() -> Sources:
    return sources("0.33.0")


def nixl_files(src: Sources) -> list[str]:
    return ex.connector_files(src, ex.registry(src), ex.NIXL)


@pytest.mark.parametrize("version", ["0.11.0", "0.33.0"])
def test_every_fixture_says_where_it_comes_from_and_parses(version: str) -> None:
    for path in sorted((FIXTURES / f"vllm-{version}").rglob("*.txt")):
        first = path.read_text().splitlines()[0]
        wheel_path = path.relative_to(FIXTURES / f"vllm-{version}").as_posix().removesuffix(".txt")
        expected = rf"# source: vllm {re.escape(version)} {re.escape(wheel_path)} \(lines [0-9, -]+;"
        assert re.match(expected, first), first
        ast.parse(path.read_text())


def test_registry_and_the_connector_files_it_points_at(old: Sources, new: Sources) -> None:
    assert [c.name for c in ex.registry(old).connectors] == [
        "SharedStorageConnector", "P2pNcclConnector", "LMCacheConnectorV1", "NixlConnector",
    ]
    assert nixl_files(old) == [NIXL_011]
    names = [c.name for c in ex.registry(new).connectors]
    assert names == ["NixlConnector", "MooncakeConnector"]
    # 0.33 registers the nixl package: all its files; Mooncake's module shares its own folder's helpers
    assert f"{NIXL_033}/pull_scheduler.py" in nixl_files(new) and f"{NIXL_033}/stats.py" in nixl_files(new)
    mooncake = ex.connector_files(new, ex.registry(new), ex.MOONCAKE)
    assert mooncake == [f"{MOONCAKE_033}/mooncake_connector.py", f"{MOONCAKE_033}/mooncake_utils.py"]


def test_kv_transfer_config_fields_and_unknown_keys(old: Sources, new: Sources) -> None:
    before, after = ex.kv_transfer_config(old), ex.kv_transfer_config(new)
    assert [f.name for f in before.fields] == [
        "kv_connector", "engine_id", "kv_buffer_device", "kv_buffer_size", "kv_role", "kv_rank",
        "kv_parallel_size", "kv_ip", "kv_port", "kv_connector_extra_config", "kv_connector_module_path",
    ]
    assert before.unknown_keys == "ignore"  # a plain pydantic dataclass: extra keys are dropped
    assert after.unknown_keys == "forbid"  # vLLM's @config passes ConfigDict(extra="forbid")
    by_name = {f.name: f for f in after.fields}
    assert "kv_buffer_size" not in by_name and "kv_ip" not in by_name
    assert by_name["kv_load_failure_policy"].default == "'fail'"
    assert by_name["kv_load_failure_policy"].type == "Literal['recompute', 'fail']"


def test_env_defaults_are_typed_like_vllm_reads_them(old: Sources, new: Sources) -> None:
    before = {v.name: v.default for v in ex.envs(old).vars}
    assert before == {
        "VLLM_NIXL_ABORT_REQUEST_TIMEOUT": 120,
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "localhost",
        "VLLM_NIXL_SIDE_CHANNEL_PORT": 5557,
    }
    after = {v.name: (v.type, v.default) for v in ex.envs(new).vars}
    assert after["VLLM_NIXL_SIDE_CHANNEL_PORT"] == ("int", 5600)
    assert after["VLLM_MOONCAKE_CONNECTOR_TIMEOUT"] == ("float", 30.0)
    # no TYPE_CHECKING line for it in the excerpt: typed by the int(...) around os.getenv
    assert after["VLLM_MOONCAKE_BOOTSTRAP_PORT"] == ("int", 8998)
    assert "VLLM_NIXL_ABORT_REQUEST_TIMEOUT" not in after


def test_side_channel_ports(old: Sources, new: Sources) -> None:
    before = ex.side_channel(old, nixl_files(old))
    assert before.listener_port == "base_port + tp_rank" and before.per_tp_rank
    assert before.dp_stride_is_tp_size and "tensor_parallel_size" in before.advertised_port
    after = ex.side_channel(new, nixl_files(new))
    assert after.listener_port == "port" and not after.per_tp_rank and not after.dp_stride_is_tp_size
    assert after.advertised_port == (
        "envs.VLLM_NIXL_SIDE_CHANNEL_PORT + vllm_config.parallel_config.data_parallel_index"
    )
    assert after.source == f"{NIXL_033}/base_scheduler.py"


def test_buffer_devices(old: Sources, new: Sources) -> None:
    assert dict(ex.buffer_devices(old, nixl_files(old)).by_platform)["cuda"] == ("cuda",)
    table = ex.buffer_devices(new, nixl_files(new))
    assert dict(table.by_platform)["cuda"] == ("cuda", "cpu") and table.source == f"{NIXL_033}/utils.py"


def test_extra_config_keys_with_defaults(old: Sources, new: Sources) -> None:
    assert {k.name: k.default for k in ex.extra_config(old, nixl_files(old)).keys} == {"backends": ("UCX",)}
    nixl = {k.name: k.default for k in ex.extra_config(new, nixl_files(new)).keys}
    assert nixl["kv_lease_duration"] == 30 and nixl["enforce_handshake_compat"] is True
    assert nixl["decoder_kv_blocks_ttl"] == 480
    mooncake = ex.extra_config(new, ex.connector_files(new, ex.registry(new), ex.MOONCAKE))
    assert {k.name: k.default for k in mooncake.keys} == {
        "device_name": "", "mooncake_protocol": "rdma", "num_workers": 10,
    }


def test_mooncake_protocol(old: Sources, new: Sources) -> None:
    assert ex.connector_files(old, ex.registry(old), ex.MOONCAKE) == []
    files = ex.connector_files(new, ex.registry(new), ex.MOONCAKE)
    protocol = ex.mooncake_protocol(new, files)
    assert protocol.read == ("remote_bootstrap_addr", "remote_engine_id", "transfer_id")
    assert protocol.bootstrap_routes == (("POST", "/register"), ("GET", "/query"))
    assert protocol.sources == tuple(files)


def test_kv_transfer_params_protocol(old: Sources, new: Sources) -> None:
    before = ex.kv_transfer_params(old, nixl_files(old))
    assert before.produced == (
        "do_remote_prefill", "do_remote_decode", "remote_block_ids", "remote_engine_id", "remote_host",
        "remote_port", "tp_size",
    )
    assert before.finish_statuses == ("FINISHED_LENGTH_CAPPED",) and before.block_ids_type == "list[int]"
    after = ex.kv_transfer_params(new, nixl_files(new))
    assert "remote_request_id" in after.produced and "remote_blocks_expiry_time" in after.produced
    assert after.finish_statuses == ("FINISHED_LENGTH_CAPPED", "FINISHED_STOPPED")
    # NixlConnector = NixlPullConnector, whose scheduler is NixlPullConnectorScheduler
    assert after.source == f"{NIXL_033}/pull_scheduler.py"
    assert after.block_ids_type == "tuple[list[int], ...] | list[list[int]]"  # BlockIds, resolved


def test_handshake(old: Sources, new: Sources) -> None:
    before = ex.handshake(old, nixl_files(old))
    assert (before.connector_version, before.hash_factors, before.min_nixl) == (None, (), None)
    after = ex.handshake(new, nixl_files(new))
    assert after.connector_version == 15 and after.min_nixl == "1.5.0"
    assert after.hash_factors[:2] == ("vllm_version", "nixl_connector_version")


def test_chunked_prefill(old: Sources, new: Sources) -> None:
    assert ex.chunked_prefill(old).forced_on and ex.chunked_prefill(old).disable_warning is None
    after = ex.chunked_prefill(new)
    assert not after.forced_on
    assert after.disable_warning is not None and after.disable_warning.startswith(
        "This model does not officially support disabling chunked prefill."
    )


def test_prefix_caching_default(old: Sources, new: Sources) -> None:
    before, after = ex.prefix_caching(old), ex.prefix_caching(new)
    assert before.default == "True" and "model_config.runner_type != 'pooling'" in before.when
    # followed from `default_prefix_caching = model_config.is_prefix_caching_supported`
    assert after.default == "model_config.is_prefix_caching_supported"
    assert after.when == "self.enable_prefix_caching is None"


def test_batch_defaults(old: Sources, new: Sources) -> None:
    before = ex.batch_defaults(old)
    assert [(t.min_gib, t.excluded, t.max_num_batched_tokens, t.max_num_seqs) for t in before.tiers] == [
        (70, ("a100",), 8192, 1024), (0, (), 2048, 256),
    ]
    assert before.max_num_seqs_rule.startswith("min(default_max_num_seqs[usage_context]")
    after = ex.batch_defaults(new)
    assert [(t.min_gib, t.excluded) for t in after.tiers] == [(160, ()), (70, ("a100", "gb10")), (0, ())]
    assert after.tiers[0].max_num_batched_tokens == 16384
    assert after.max_num_seqs_rule == "min(self.max_num_seqs, self.max_num_batched_tokens)"


def test_a_missing_file_is_named() -> None:
    src = Sources("9.9.9", {})
    with pytest.raises(KeyError, match="vLLM 9.9.9 has no vllm/distributed/kv_transfer/kv_connector/factory"):
        ex.extract(src)

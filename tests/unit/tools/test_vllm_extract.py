"""Each engine and config fact read from small excerpts of vLLM 0.11.0's and 0.33.0's own files
(tests/unit/tools/fixtures, every file headed by its `source:` release and path), as a wheel is read."""

from __future__ import annotations

import ast
import re

import pytest

from tests.unit.tools.helpers import (
    FIXTURES,
    MOONCAKE_033,
    NIXL_011,
    NIXL_033,
    mooncake_files,
    nixl_files,
    sources,
)
from tools import vllm_extract as ex
from tools.vllm_ast import Sources


@pytest.fixture(scope="module")
def old() -> Sources:
    return sources("0.11.0")


@pytest.fixture(scope="module")
def new() -> Sources:
    return sources("0.33.0")


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
        "SharedStorageConnector",
        "P2pNcclConnector",
        "LMCacheConnectorV1",
        "NixlConnector",
    ]
    assert nixl_files(old) == [NIXL_011]
    names = [c.name for c in ex.registry(new).connectors]
    assert names == ["NixlConnector", "MooncakeConnector"]
    # 0.33 registers the nixl package: all its files; Mooncake's module shares its own folder's helpers
    assert f"{NIXL_033}/pull_scheduler.py" in nixl_files(new) and f"{NIXL_033}/stats.py" in nixl_files(new)
    mooncake = mooncake_files(new)
    assert mooncake == [
        f"{MOONCAKE_033}/{name}.py" for name in ("mooncake_connector", "mooncake_utils", "stats")
    ]


def test_kv_transfer_config_fields_and_unknown_keys(old: Sources, new: Sources) -> None:
    before, after = ex.kv_transfer_config(old), ex.kv_transfer_config(new)
    assert [f.name for f in before.fields] == [
        "kv_connector",
        "engine_id",
        "kv_buffer_device",
        "kv_buffer_size",
        "kv_role",
        "kv_rank",
        "kv_parallel_size",
        "kv_ip",
        "kv_port",
        "kv_connector_extra_config",
        "kv_connector_module_path",
    ]
    assert before.unknown_keys == "ignore"  # a plain pydantic dataclass: extra keys are dropped
    assert after.unknown_keys == "forbid"  # vLLM's @config passes ConfigDict(extra="forbid")
    by_name = {f.name: f for f in after.fields}
    assert "kv_buffer_size" not in by_name and "kv_ip" not in by_name
    assert by_name["kv_load_failure_policy"].default == "'fail'"
    assert by_name["kv_load_failure_policy"].type == "Literal['recompute', 'fail']"
    # a connector without a role: 0.11.0 asks for kv_disagg_role, an option name it does not have
    tail = "when kv_connector is set, supported roles are"
    assert (before.missing_role, after.missing_role) == (
        f"Please specify kv_disagg_role {tail}",
        f"Please specify kv_role {tail}",
    )


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
    # 0.33's PrefixCacheStats.record puts a preempted request's lookup in preempted_queries/hits
    assert (before.preempted_apart, after.preempted_apart) == (False, True)
    assert before.stats_source == after.stats_source == "vllm/v1/metrics/stats.py"


def test_batch_defaults(old: Sources, new: Sources) -> None:
    before = ex.batch_defaults(old)
    assert [(t.min_gib, t.excluded, t.max_num_batched_tokens, t.max_num_seqs) for t in before.tiers] == [
        (70, ("a100",), 8192, 1024),
        (0, (), 2048, 256),
    ]
    assert before.max_num_seqs_rule.startswith("min(default_max_num_seqs[usage_context]")
    after = ex.batch_defaults(new)
    assert [(t.min_gib, t.excluded) for t in after.tiers] == [(160, ()), (70, ("a100", "gb10")), (0, ())]
    assert after.tiers[0].max_num_batched_tokens == 16384
    assert after.max_num_seqs_rule == "min(self.max_num_seqs, self.max_num_batched_tokens)"
    # --performance-mode throughput doubles both defaulted limits (0.33); 0.11 has no such option
    assert (before.mode_factors, after.mode_factors) == ((), (("throughput", 2),))


def test_a_performance_mode_scaling_the_limits_apart_is_refused(new: Sources) -> None:
    """A mode that scales max_num_batched_tokens and max_num_seqs by different factors cannot be one
    table row: the generator says so instead of tabling half of it."""
    text = new.files[ex.ARG_UTILS].replace("self.max_num_seqs *= 2", "self.max_num_seqs *= 4")
    with pytest.raises(KeyError, match="--performance-mode throughput scales"):
        ex.batch_defaults(Sources(new.version, {**new.files, ex.ARG_UTILS: text}))


def test_a_missing_file_is_named() -> None:
    src = Sources("9.9.9", {})
    with pytest.raises(KeyError, match="vLLM 9.9.9 has no vllm/distributed/kv_transfer/kv_connector/factory"):
        ex.extract(src)

"""The committed facts table: each release names its sources, and states every row of issue 12's table
(vLLM 0.11.0 against 0.33.0) as the wheels have it."""

from __future__ import annotations

import dataclasses
import re
import zipfile
from pathlib import Path

import pytest

from pdfleet.model.vllm_release_data import NEWEST, RELEASES
from pdfleet.model.vllm_releases import version_key

OLD, NEW = RELEASES["0.11.0"], RELEASES["0.33.0"]


def _sources(value: object) -> list[str]:
    """Every `source`/`sources` a row holds."""
    found: list[str] = []
    if dataclasses.is_dataclass(value):
        for field in dataclasses.fields(value):
            item = getattr(value, field.name)
            if field.name == "source":
                found.append(item)
            elif field.name == "sources":
                found += list(item)
            else:
                found += _sources(item)
    elif isinstance(value, tuple):
        for item in value:
            found += _sources(item)
    return found


@pytest.mark.parametrize("version", sorted(RELEASES))
def test_every_row_names_a_vllm_file(version: str) -> None:
    release = RELEASES[version]
    assert release.version == version
    for field in dataclasses.fields(release):
        row = getattr(release, field.name)
        if field.name != "version" and row is not None:
            paths = _sources(row)
            assert paths, f"{version}: {field.name} names no source"
            assert all(p.startswith("vllm/") and p.endswith(".py") for p in paths), paths


def test_newest_is_the_newest() -> None:
    assert NEWEST == max(RELEASES, key=version_key) == "0.33.0"


def test_issue_12_rows() -> None:
    params = OLD.kv_transfer_params, NEW.kv_transfer_params
    assert "remote_request_id" not in params[0].produced and "remote_request_id" in params[1].produced
    assert params[0].block_ids_type == "list[int]" and params[1].block_ids_type.startswith("tuple[list[int]")
    assert params[0].finish_statuses == ("FINISHED_LENGTH_CAPPED",)
    assert "FINISHED_STOPPED" in params[1].finish_statuses
    assert {"remote_num_tokens", "remote_blocks_expiry_time", "transfer_mode", "dcp_size", "pp_size"} <= set(
        params[1].produced
    )
    nixl = [m.name for m in NEW.metrics if m.name.startswith("vllm:nixl_")]
    assert not [m for m in OLD.metrics if m.name.startswith("vllm:nixl_")] and len(nixl) == 8
    assert "vllm:nixl_num_notifications_after_expiry" in nixl
    assert NEW.metric("vllm:nixl_xfer_time_seconds").buckets[::11] == (0.005, 5.0)
    assert NEW.metric("vllm:nixl_bytes_transferred").buckets == tuple(2**e for e in range(11, 34, 2))
    assert NEW.metric("vllm:nixl_num_descriptors").buckets[::13] == (10, 50000)
    port = "VLLM_NIXL_SIDE_CHANNEL_PORT"
    assert (OLD.env_default(port), NEW.env_default(port)) == (5557, 5600)
    assert OLD.side_channel.per_tp_rank and not NEW.side_channel.per_tp_rank
    assert OLD.kv_hold_s() == ("timeout", 120.0) and NEW.kv_hold_s() == ("lease", 30.0)
    assert not NEW.has_env("VLLM_NIXL_ABORT_REQUEST_TIMEOUT")
    assert "cpu" not in OLD.buffer_devices_on("cuda") and "cpu" in NEW.buffer_devices_on("cuda")
    assert OLD.chunked_prefill.forced_on and not NEW.chunked_prefill.forced_on
    assert NEW.chunked_prefill.disable_warning
    assert "min(" in OLD.batch_defaults.max_num_seqs_rule and "min(" in NEW.batch_defaults.max_num_seqs_rule
    assert NEW.batch_defaults.tiers[0].min_gib == 160 and OLD.batch_defaults.tiers[0].min_gib == 70
    assert not OLD.has_connector("MooncakeConnector") and NEW.has_connector("MooncakeConnector")
    assert OLD.mooncake_protocol is None and NEW.mooncake_protocol is not None
    assert {"transfer_id", "remote_bootstrap_addr", "remote_engine_id"} <= set(NEW.mooncake_protocol.read)
    assert ("GET", "/query") in NEW.mooncake_protocol.bootstrap_routes
    assert (OLD.kv_transfer_config.unknown_keys, NEW.kv_transfer_config.unknown_keys) == ("ignore", "forbid")
    assert {"kv_buffer_size", "kv_rank", "kv_parallel_size", "kv_ip"} <= set(OLD.config_keys())
    assert not {"kv_buffer_size", "kv_rank", "kv_parallel_size", "kv_ip"} & set(NEW.config_keys())
    assert OLD.handshake.hash_factors == () and "vllm_version" in NEW.handshake.hash_factors
    assert NEW.extra_default("NixlConnector", "enforce_handshake_compat") is True
    assert (OLD.handshake.min_nixl, NEW.handshake.min_nixl) == (None, "1.5.0")


def test_request_chain_histograms() -> None:
    for release in (OLD, NEW):
        for name in (
            "time_to_first_token_seconds",
            "inter_token_latency_seconds",
            "request_time_per_output_token_seconds",
            "request_queue_time_seconds",
            "request_prefill_time_seconds",
            "request_decode_time_seconds",
        ):
            metric = release.metric(f"vllm:{name}")
            assert metric.kind == "histogram" and metric.buckets and metric.labels == ("model_name", "engine")
        for name in ("prefix_cache_queries", "prefix_cache_hits", "num_preemptions"):
            assert release.metric(f"vllm:{name}").kind == "counter"
        assert release.metric("vllm:kv_cache_usage_perc").kind == "gauge"
    assert OLD.metric("vllm:time_per_output_token_seconds").when is None  # deprecated, still shown in 0.11
    with pytest.raises(KeyError):
        NEW.metric("vllm:time_per_output_token_seconds")
    assert (
        OLD.metric("vllm:request_queue_time_seconds").buckets
        == NEW.metric("vllm:request_queue_time_seconds").buckets
    )


@pytest.mark.parametrize("version", ["0.11.1", "0.11.2"])
def test_patch_releases_have_rows_of_their_own(version: str) -> None:
    """0.11.1/0.11.2 differ from 0.11.0 where an operator sees it (issue 25, item 1): port 5600, a 480 s
    hold, one side-channel listener per instance, six vllm:nixl_* metrics, chunked prefill off honoured,
    cpu buffers on CUDA."""
    patch = RELEASES[version]
    assert patch.env_default("VLLM_NIXL_SIDE_CHANNEL_PORT") == 5600
    assert patch.kv_hold_s() == ("timeout", 480.0)
    assert patch.side_channel_ports(5600, tensor_parallel_size=2) == (5600,)
    assert OLD.side_channel_ports(5600, tensor_parallel_size=2) == (5600, 5601)
    assert len([m for m in patch.metric_names() if m.startswith("vllm:nixl_")]) == 6
    assert not patch.chunked_prefill.forced_on and "cpu" in patch.buffer_devices_on("cuda")


WHEELS = Path("~/.cache/pdfleet/vllm-wheels").expanduser()  # where `python -m tools.vllm_facts` keeps them
# `vllm:` strings that name no family: prefixes benchmarks/serve.py tests lines with (`line.startswith`)
PREFIXES = {"vllm:diffusion", "vllm:spec_decode"}


def _wheel(version: str) -> Path | None:
    found = sorted(WHEELS.glob(f"vllm-{version}-*.whl"))
    return found[-1] if found else None


@pytest.mark.parametrize("version", sorted(RELEASES))
def test_every_metric_family_the_wheel_spells_is_tabled(version: str) -> None:
    """Issue 25 (the generator's blind spots): every quoted `vllm:<name>` in the release's own .py files (a
    plain text search, not the generator's reading) is a `metrics` row or in `other_metrics`, but for the
    two prefixes; and the table holds no name the wheel does not spell. Read from the cached wheel."""
    wheel = _wheel(version)
    if wheel is None:
        pytest.skip(f"vLLM {version}'s wheel is not in {WHEELS} (python -m tools.vllm_facts downloads it)")
    spelled: set[str] = set()
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.startswith("vllm/") and name.endswith(".py"):
                spelled |= set(re.findall(r"[\"'](vllm:[a-z0-9_]+)[\"']", archive.read(name).decode()))
    release = RELEASES[version]
    tabled = {m.name for m in release.metrics} | {n for o in release.other_metrics for n in o.names}
    assert spelled - tabled <= PREFIXES and not tabled - spelled, (spelled - tabled, tabled - spelled)

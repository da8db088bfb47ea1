"""Profile checks per pinned vLLM release: each rule on the release where it bites, and the same profile
passing on the release where it does not (so no rule can fire unconditionally)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdfleet.errors import ValidationError
from pdfleet.model.checks import MANAGED_FLAGS
from pdfleet.model.profile_loader import load_profile
from pdfleet.model.release_checks import managed_flag
from pdfleet.model.vllm_release_data import RELEASES
from tests.unit.model.helpers import GOOD

TP2_SAME_HOST = (
    "topology: same-host\npools: {prefill: {gpus: [0, 1], tensor_parallel_size: 2}, decode: {gpus: [2]}}\n"
)

# (id, YAML after `extends: _good`, the pin it fails on, the pin it passes on, key path, message text)
CASES: list[tuple[str, str, str, str | None, str, str]] = [
    (
        "buffer_device_cpu",
        "kv_transfer: {buffer_device: cpu}\n",
        "0.11.0",
        "0.33.0",
        "kv_transfer.buffer_device",
        "vLLM 0.11.0's NixlConnector fails at start with kv_buffer_device 'cpu' on CUDA (allowed: cuda;",
    ),
    (
        "buffer_device_cpu_patch",  # a 0.11.2 pin is 0.11.2's row, not its minor's: NIXL takes cpu there
        "kv_transfer: {buffer_device: cpu}\n",
        "0.11.0",
        "0.11.2",
        "kv_transfer.buffer_device",
        "vLLM 0.11.0's NixlConnector fails at start with kv_buffer_device 'cpu'",
    ),
    (
        "load_failure_policy",
        "kv_transfer: {load_failure_policy: recompute}\n",
        "0.11.0",
        "0.33.0",
        "kv_transfer.load_failure_policy",
        "ignores it without a word",
    ),
    (
        "lease_key_on_old_release",
        "kv_transfer: {extra_config: {kv_lease_duration: 60}}\n",
        "0.11.0",
        "0.33.0",
        "kv_transfer.extra_config.kv_lease_duration",
        "NixlConnector in vLLM 0.11.0 reads no kv_connector_extra_config.kv_lease_duration "
        "(it reads backends)",
    ),
    (
        "misspelt_extra_key",
        "kv_transfer: {extra_config: {num_thread: 8}}\n",
        "0.33.0",
        None,
        "kv_transfer.extra_config.num_thread",
        "reads no kv_connector_extra_config.num_thread",
    ),
    (
        "chunked_prefill_off",
        "pools: {decode: {enable_chunked_prefill: false, max_num_batched_tokens: 32768}}\n",
        "0.11.0",
        "0.33.0",
        "pools.decode.enable_chunked_prefill",
        "vLLM 0.11.0 forces chunked prefill on for generative models whatever the flag says",
    ),
    (
        "chunked_prefill_off_patch",  # 0.11.1 and 0.11.2 honour false
        "pools: {decode: {enable_chunked_prefill: false, max_num_batched_tokens: 32768}}\n",
        "0.11.0",
        "0.11.2",
        "pools.decode.enable_chunked_prefill",
        "vLLM 0.11.0 forces chunked prefill on",
    ),
    (
        "kv_cache_dtype_not_a_choice",  # 0.11.0's argparse choices lack fp8_ds_mla; 0.33.0's literal has it
        "pools: {decode: {kv_cache_dtype: fp8_ds_mla}}\n",
        "0.11.0",
        "0.33.0",
        "pools.decode.kv_cache_dtype",
        "vLLM 0.11.0 fails at start with --kv-cache-dtype 'fp8_ds_mla': argparse refuses it (invalid "
        "choice); it takes auto, bfloat16, fp8, fp8_e4m3, fp8_e5m2, fp8_inc",
    ),
    (
        "kv_cache_dtype_float16",
        "pools: {prefill: {kv_cache_dtype: float16}}\n",
        "0.11.2",
        "0.33.0",
        "pools.prefill.kv_cache_dtype",
        "vLLM 0.11.2 fails at start with --kv-cache-dtype 'float16'",
    ),
    (
        "kv_cache_dtype_unknown_to_cache_config",  # 0.33: `CacheDType | str`, the validator refuses it
        "pools: {decode: {kv_cache_dtype: fp4}}\n",
        "0.33.0",
        None,
        "pools.decode.kv_cache_dtype",
        "vLLM 0.33.0 fails at start with --kv-cache-dtype 'fp4': its CacheConfig refuses it (Invalid "
        "kv_cache_dtype) unless a platform plugin registers it",
    ),
    (
        "extra_args_negative_spelling",  # 0.33's EnableDisableAction: --disable-x sets enable_x False
        "pools: {decode: {extra_args: [--disable-chunked-prefill]}}\n",
        "0.33.0",
        None,
        "pools.decode.extra_args[0]",
        "--disable-chunked-prefill (--enable-chunked-prefill in vLLM 0.33.0) is rendered by pdfleet from "
        "pools.decode.enable_chunked_prefill",
    ),
    (
        "extra_args_alias",
        "pools: {decode: {extra_args: [--device-memory-utilization=0.5]}}\n",
        "0.33.0",
        None,
        "pools.decode.extra_args[0]",
        "--device-memory-utilization (--gpu-memory-utilization in vLLM 0.33.0) is rendered by pdfleet",
    ),
    (
        "extra_args_abbreviation",  # argparse's allow_abbrev: an unambiguous prefix is the option
        "pools: {prefill: {extra_args: [--max-num-batched, '1024']}}\n",
        "0.33.0",
        None,
        "pools.prefill.extra_args[0]",
        "--max-num-batched (--max-num-batched-tokens in vLLM 0.33.0) is rendered by pdfleet from "
        "pools.prefill.max_num_batched_tokens",
    ),
    (
        "untabled_pin",
        "",
        "0.20.0",
        None,
        "vllm.version",
        "pdfleet has no facts for vLLM 0.20.0 (it knows 0.11.0, 0.11.1, 0.11.2, 0.33.0); pin one of those, "
        "or derive the table for it: python -m tools.vllm_facts 0.20.0 --write",
    ),
    (
        "untabled_patch_pin",  # never its minor's row: refused by name
        "",
        "0.11.3",
        None,
        "vllm.version",
        "pdfleet has no facts for vLLM 0.11.3 (it knows 0.11.0, 0.11.1, 0.11.2, 0.33.0)",
    ),
]


def _load(tmp_path: Path, text: str, pin: str) -> object:
    (tmp_path / "_good.yml").write_text(GOOD)
    (tmp_path / "case.yml").write_text(f"extends: _good\nvllm: {{version: '{pin}'}}\n{text}")
    return load_profile("case", tmp_path)


@pytest.mark.parametrize(("case", "text", "bad", "good", "key", "expected"), CASES, ids=[c[0] for c in CASES])
def test_release_rule(
    tmp_path: Path, case: str, text: str, bad: str, good: str | None, key: str, expected: str
) -> None:
    with pytest.raises(ValidationError) as err:
        _load(tmp_path, text, bad)
    lines = [line.split(": ", 1)[1] for line in str(err.value).splitlines()]
    assert any(line.startswith(f"{key}: ") and expected in line for line in lines), "\n".join(lines)
    if good is not None:
        _load(tmp_path, text, good)


def test_same_host_tp2_on_old_release_gets_decode_ports_past_prefill_s(tmp_path: Path) -> None:
    """0.11 binds one side-channel port per TP rank: the decode instance starts past the last one."""
    old = _load(tmp_path, TP2_SAME_HOST, "0.11.0")
    assert old.side_channel_port_for("prefill") == 5600  # type: ignore[attr-defined]
    assert old.side_channel_port_for("decode") == 5602  # type: ignore[attr-defined]
    new = _load(tmp_path, TP2_SAME_HOST, "0.33.0")
    assert new.side_channel_port_for("decode") == 5601  # type: ignore[attr-defined]
    patch = _load(tmp_path, TP2_SAME_HOST, "0.11.2")  # one listener at base + dp_rank, as 0.33
    assert patch.side_channel_port_for("decode") == 5601  # type: ignore[attr-defined]


def test_same_host_tp2_side_channel_ports_collide_with_a_pool_port(tmp_path: Path) -> None:
    """Every port a 0.11 TP rank binds is checked against the host's other ports."""
    text = TP2_SAME_HOST.replace("decode: {gpus: [2]}", "decode: {gpus: [2], port: 5601}")
    with pytest.raises(
        ValidationError,
        match="port 5601 is used twice on a same-host host: by "
        r"kv_transfer.side_channel_port \(prefill side channel, TP rank 1\)",
    ):
        _load(tmp_path, text, "0.11.0")
    _load(tmp_path, text.replace("port: 5601", "port: 5609"), "0.11.0")


def test_managed_flag_reads_a_word_as_the_release_s_parser_does() -> None:
    """An alias, a negative or an unambiguous prefix is the managed option; an ambiguous prefix or an
    unmanaged option is none (0.11 has no --disable-x negatives: there it is no option at all)."""
    new, old = RELEASES["0.33.0"], RELEASES["0.11.0"]
    assert managed_flag("--max-num-batched=8", new, MANAGED_FLAGS) == "--max-num-batched-tokens"
    assert managed_flag("--max-num-batched", old, MANAGED_FLAGS) == "--max-num-batched-tokens"
    assert managed_flag("--kv-cache", new, MANAGED_FLAGS) is None  # ambiguous: vLLM's own error
    assert managed_flag("--enforce-eager", new, MANAGED_FLAGS) is None
    assert managed_flag("--disable-chunked-prefill", old, MANAGED_FLAGS) is None
    assert managed_flag("--kv-transfer-config.kv_role", new, MANAGED_FLAGS) == "--kv-transfer-config"

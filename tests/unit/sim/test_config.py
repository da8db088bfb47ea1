"""Building a SimConfig: rendered `vllm serve` command lines parse; bad values fail like vLLM."""

from __future__ import annotations

import json

import pytest

from pdfleet.errors import ValidationError
from pdfleet.sim.config import describe, parse_serve_args
from pdfleet.sim.metrics import SimMetrics
from tests.unit.sim.helpers import MODEL, kv_config

# What pdfleet.fleet.vllm_args.serve_argv renders for a lab decode instance with engine "sim".
RENDERED = [
    "/opt/pdfleet/venv/bin/pdfleet-sim",
    "serve",
    MODEL,
    "--host",
    "198.18.0.31",
    "--port",
    "8200",
    "--served-model-name",
    MODEL,
    "--tensor-parallel-size",
    "1",
    "--max-num-batched-tokens",
    "2048",
    "--gpu-memory-utilization",
    "0.9",
    "--max-num-seqs",
    "256",
    "--kv-cache-dtype",
    "auto",
    "--enable-chunked-prefill",
    "--max-model-len",
    "32768",
    "--kv-transfer-config",
    json.dumps(
        {
            "kv_buffer_device": "cuda",
            "kv_connector": "NixlConnector",
            "kv_connector_extra_config": {"backends": ["UCX"]},
            "kv_load_failure_policy": "fail",
            "kv_role": "kv_consumer",
        },
        separators=(",", ":"),
        sort_keys=True,
    ),
    "--sim-gpu",
    "H100-SXM",
    "--sim-link",
    "roce-400g",
    "--sim-time-scale",
    "1.0",
]
ENV = {
    "VLLM_NIXL_SIDE_CHANNEL_HOST": "198.18.0.31",
    "VLLM_NIXL_SIDE_CHANNEL_PORT": "5601",
    "CUDA_VISIBLE_DEVICES": "0",
}


def test_rendered_command_parses() -> None:
    cfg = parse_serve_args(RENDERED, env=ENV)
    assert cfg.host == "198.18.0.31" and cfg.port == 8200
    assert cfg.served_model_names == (MODEL,)
    assert cfg.max_num_batched_tokens == 2048 and cfg.max_num_seqs == 256 and cfg.max_model_len == 32768
    assert cfg.enable_chunked_prefill is True
    assert cfg.kv_transfer is not None and cfg.kv_transfer.role == "kv_consumer"
    assert cfg.kv_transfer.load_failure_policy == "fail"
    assert (cfg.side_channel_host, cfg.side_channel_port) == ("198.18.0.31", 5601)
    assert cfg.gpu.name == "H100-SXM" and cfg.link.name == "roce-400g"
    assert cfg.model_spec.name == "Llama-3.1-8B"
    # 0.9 × 80 GiB − 16.06 GB weights − 2 GiB reserve, in 16-token blocks of 128 KiB per token
    assert cfg.num_blocks * 16 == pytest.approx(450_000, rel=0.02)


def test_vllm_spellings_are_accepted() -> None:
    cfg = parse_serve_args(
        [
            "serve",
            "--model",
            "/models/Llama-3.1-70B-Instruct",
            "-tp",
            "4",
            "--max_num_seqs=64",
            "--no-enable-chunked-prefill",
            "--max-model-len",
            "16k",
            "--trust-remote-code",
            "--enforce-eager",
            "--cudagraph-capture-sizes",
            "1",
            "2",
            "4",
            "--dtype",
            "bfloat16",
            "--disable-log-requests",
            "--enable-prefix-caching",
            "--api-key",
            "k1",
            "--kv-cache-dtype",
            "fp8",
            "--seed",
            "0",
            "--uvicorn-log-level",
            "warning",
        ],
        env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"},
    )
    assert cfg.model_spec.name == "Llama-3.1-70B" and cfg.tensor_parallel_size == 4
    assert cfg.max_num_seqs == 64 and cfg.max_model_len == 16000
    assert cfg.enable_chunked_prefill is False
    assert cfg.max_num_batched_tokens == 16000  # vLLM: whole prompts need max_model_len tokens per step
    assert cfg.kv_bytes_per_token == 163840  # fp8 halves the 320 KiB/token of bf16
    assert cfg.api_keys == ("k1",)


def test_defaults_follow_vllm_batch_defaults() -> None:
    h100 = parse_serve_args([MODEL], env={})
    a100 = parse_serve_args([MODEL, "--sim-gpu", "A100-80GB"], env={})
    assert (h100.max_num_batched_tokens, h100.max_num_seqs) == (8192, 1024)
    assert (a100.max_num_batched_tokens, a100.max_num_seqs) == (2048, 256)


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        ([MODEL, "--kv-transfer-config", '{"kv_connector":"NixlConnector"}'], {}, "Please specify kv_role"),
        (  # 0.11.0's wording names an option that does not exist
            [
                MODEL,
                "--sim-vllm-version",
                "0.11.0",
                "--kv-transfer-config",
                '{"kv_connector":"NixlConnector"}',
            ],
            {},
            "Please specify kv_disagg_role when kv_connector is set, supported roles are",
        ),
        (
            [
                MODEL,
                "--kv-transfer-config",
                '{"kv_connector":"MooncakeTransferEngine","kv_role":"kv_producer"}',
            ],
            {},
            "Unsupported connector type: MooncakeTransferEngine",
        ),
        (
            [
                MODEL,
                "--kv-transfer-config",
                '{"kv_connector":"NixlConnector","kv_role":"kv_producer","kv_rol":1}',
            ],
            {},
            "unknown field(s) kv_rol",
        ),
        ([MODEL, "--kv-transfer-config", "{nope"], {}, "not valid JSON"),
        ([MODEL, "--sim-gpu", "H100"], {}, "--sim-gpu 'H100': unknown GPU; known: H100-SXM"),
        ([MODEL, "--sim-link", "rdma"], {}, "unknown link; known: pcie-gen4"),
        (["mistralai/Mistral-7B"], {}, "not in the simulator's catalog"),
        ([MODEL, "-tp", "2"], {"CUDA_VISIBLE_DEVICES": "3"}, "tensor_parallel_size (2) is larger"),
        (["meta-llama/Llama-3.1-70B-Instruct"], {}, "No available memory for the cache blocks"),
        ([MODEL, "--gpu-memory-utilization", "0.25"], {}, "larger than the maximum number of tokens"),
        ([MODEL, "--max-model-len", "200000"], {}, "greater than the derived max_model_len"),
        (
            [MODEL, "--max-num-batched-tokens", "128", "--max-num-seqs", "256"],
            {},
            "must be greater than or equal",
        ),
        ([MODEL], {"VLLM_NIXL_SIDE_CHANNEL_PORT": "x"}, "VLLM_NIXL_SIDE_CHANNEL_PORT='x': not an integer"),
        ([], {}, "the following arguments are required: model_tag"),
    ],
)
def test_bad_options_fail_clearly(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(ValidationError) as exc:
        parse_serve_args(argv, env=env)
    assert message in str(exc.value)


def test_engine_limits_and_start_up_line_follow_the_options() -> None:
    kv = kv_config("kv_consumer", kv_load_failure_policy="recompute")
    cfg = parse_serve_args([MODEL, "--max-num-seqs", "64", "--kv-transfer-config", kv], env={})
    limits = cfg.limits()
    assert (limits.num_blocks, limits.max_num_seqs) == (cfg.num_blocks, 64)
    assert limits.recompute_on_load_failure is True
    assert cfg.engine().limits == limits
    line = describe(cfg)
    assert line.startswith("Llama-3.1-8B on 1x H100-SXM: ") and line.endswith("kv_role=kv_consumer")


def test_the_hold_follows_the_release_lease_on_0_33_abort_timeout_on_0_11() -> None:
    """0.33 reads kv_lease_duration (default 30 s) and not the removed env var; 0.11 the reverse (120 s)."""
    leased = kv_config("kv_producer", kv_connector_extra_config={"kv_lease_duration": 10})
    plain = kv_config("kv_producer")
    env = {"VLLM_NIXL_ABORT_REQUEST_TIMEOUT": "40"}
    assert parse_serve_args([MODEL, "--kv-transfer-config", leased], env=env).abort_timeout_s == 10.0
    assert parse_serve_args([MODEL, "--kv-transfer-config", plain], env=env).abort_timeout_s == 30.0
    old = ["--sim-vllm-version", "0.11.0", "--kv-transfer-config"]
    assert parse_serve_args([MODEL, *old, plain], env=env).abort_timeout_s == 40.0
    assert parse_serve_args([MODEL, *old, plain], env={}).abort_timeout_s == 120.0


def test_release_rules_of_kv_transfer_config_and_defaults() -> None:
    """Unknown keys refused on 0.33, ignored on 0.11; cpu buffers fail on 0.11; ports, batch defaults."""
    legacy = kv_config("kv_producer", kv_buffer_size=1e9)
    with pytest.raises(ValidationError, match=r"unknown field\(s\) kv_buffer_size for KVTransferConfig"):
        parse_serve_args([MODEL, "--kv-transfer-config", legacy], env={})
    old = parse_serve_args([MODEL, "--sim-vllm-version", "0.11.0", "--kv-transfer-config", legacy], env={})
    assert old.kv_transfer is not None and old.kv_transfer.load_failure_policy == "recompute"
    assert old.side_channel_port == 5557 and old.release.version == "0.11.0"
    cpu = kv_config("kv_producer", kv_buffer_device="cpu")
    assert parse_serve_args([MODEL, "--kv-transfer-config", cpu], env={}).kv_transfer is not None
    with pytest.raises(ValidationError, match="kv_buffer_device 'cpu' is not supported by NixlConnector"):
        parse_serve_args([MODEL, "--sim-vllm-version", "0.11.0", "--kv-transfer-config", cpu], env={})
    new = parse_serve_args([MODEL, "--sim-gpu", "H200"], env={})
    assert (new.max_num_batched_tokens, new.max_num_seqs) == (8192, 1024)  # 141 GB: below the 160 GiB tier
    small = parse_serve_args([MODEL, "--max-num-batched-tokens", "128"], env={})
    assert small.max_num_seqs == 128  # min(default, max_num_batched_tokens)
    off = ["--no-enable-chunked-prefill", "--max-model-len", "8192"]
    assert not parse_serve_args([MODEL, *off], env={}).enable_chunked_prefill
    assert parse_serve_args([MODEL, *off, "--sim-vllm-version", "0.11.0"], env={}).enable_chunked_prefill
    with pytest.raises(ValidationError, match="--sim-vllm-version 0.20.0: the simulator models vLLM 0.11"):
        parse_serve_args([MODEL, "--sim-vllm-version", "0.20.0"], env={})


def test_a_patch_pin_models_its_own_release_not_its_minor() -> None:
    """--sim-vllm-version 0.11.2 is 0.11.2 (port 5600, 480 s hold, chunked prefill off honoured, nixl_*
    metrics), not 0.11.0; an untabled patch is refused by name."""
    plain = kv_config("kv_producer")
    cfg = parse_serve_args([MODEL, "--sim-vllm-version", "0.11.2", "--kv-transfer-config", plain], env={})
    assert (cfg.release.version, cfg.side_channel_port, cfg.abort_timeout_s) == ("0.11.2", 5600, 480.0)
    off = ["--no-enable-chunked-prefill", "--max-model-len", "8192", "--sim-vllm-version", "0.11.2"]
    assert not parse_serve_args([MODEL, *off], env={}).enable_chunked_prefill
    assert SimMetrics(8192, pd=True, release=cfg.release).pd  # vllm:nixl_* exported
    with pytest.raises(
        ValidationError, match=r"--sim-vllm-version 0.11.3: the simulator models vLLM 0.11.0, 0.11.1"
    ):
        parse_serve_args([MODEL, "--sim-vllm-version", "0.11.3"], env={})


def test_throughput_performance_mode_doubles_the_defaulted_batch_limits() -> None:
    """0.33's --performance-mode throughput doubles a defaulted max_num_batched_tokens and max_num_seqs
    (a given one is kept), interactivity and balanced leave them; an unknown mode is argparse's refusal,
    and 0.11.2 has no such option."""
    mode = [MODEL, "--sim-gpu", "H100-SXM", "--performance-mode"]
    plain = parse_serve_args([MODEL, "--sim-gpu", "H100-SXM"], env={})
    assert (plain.max_num_batched_tokens, plain.max_num_seqs) == (8192, 1024)
    fast = parse_serve_args([*mode, "throughput"], env={})
    assert (fast.max_num_batched_tokens, fast.max_num_seqs) == (16384, 2048)
    given = parse_serve_args([*mode, "throughput", "--max-num-batched-tokens", "4096"], env={})
    assert (given.max_num_batched_tokens, given.max_num_seqs) == (4096, 2048)
    for other in ("balanced", "interactivity"):
        assert parse_serve_args([*mode, other], env={}).max_num_batched_tokens == 8192
    with pytest.raises(ValidationError, match="argument --performance-mode: invalid choice: 'fast'"):
        parse_serve_args([*mode, "fast"], env={})
    with pytest.raises(ValidationError, match="unrecognized arguments: --performance-mode"):
        parse_serve_args([*mode, "throughput", "--sim-vllm-version", "0.11.2"], env={})


def test_kv_cache_dtype_is_the_release_s_choice() -> None:
    """0.11.0's argparse refuses fp8_ds_mla and float16 (choices); 0.33.0 takes both (its CacheDType) and
    refuses a value outside it as its CacheConfig does; a taken value the simulator cannot size is its own
    refusal, worded as such."""
    old = [MODEL, "--sim-vllm-version", "0.11.0", "--kv-cache-dtype"]
    for dtype in ("fp8_ds_mla", "float16"):
        with pytest.raises(ValidationError, match=f"argument --kv-cache-dtype: invalid choice: '{dtype}'"):
            parse_serve_args([*old, dtype], env={})
        assert parse_serve_args([MODEL, "--kv-cache-dtype", dtype], env={}).kv_cache_dtype == dtype
    with pytest.raises(ValidationError, match=r"Invalid kv_cache_dtype: 'fp4'. Valid values are: \['auto'"):
        parse_serve_args([MODEL, "--kv-cache-dtype", "fp4"], env={})
    with pytest.raises(
        ValidationError, match="vLLM 0.33.0 takes it, but the simulator has no KV element size"
    ):
        parse_serve_args([MODEL, "--kv-cache-dtype", "turboquant_k8v4"], env={})
    assert parse_serve_args([*old, "fp8"], env={}).kv_cache_dtype == "fp8"


def test_prefix_caching_is_on_unless_the_flag_turns_it_off() -> None:
    # unset: EngineArgs' default (0.11 True; 0.33 is_prefix_caching_supported, True for these models)
    for version in ("0.11.0", "0.33.0"):
        cfg = parse_serve_args([MODEL, "--sim-vllm-version", version], env={})
        assert cfg.enable_prefix_caching is True and cfg.limits().enable_prefix_caching is True
        skip = cfg.limits().prefix_stats_skip_preempted
        assert skip is (version == "0.33.0")  # the table's prefix_caching.preempted_apart
    assert parse_serve_args([MODEL, "--no-enable-prefix-caching"], env={}).enable_prefix_caching is False
    off = parse_serve_args([MODEL, "--disable-prefix-caching"], env={})
    assert off.limits().enable_prefix_caching is False

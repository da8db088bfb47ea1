"""The `serve` command line as argparse reads it: the pinned release's options and spellings, ignored
options, typos and removed options rejected, abbreviations as the release's parser takes them."""

from __future__ import annotations

import argparse

import pytest

from pdfleet.errors import ValidationError
from pdfleet.sim.serve_options import _human_int, _normalise, build_parser, parse_argv
from tests.unit.sim.helpers import MODEL


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([MODEL, "--max-num-batched-tokenz", "2048"], "unrecognized arguments: --max-num-batched-tokenz"),
        ([MODEL, "--max-num-batched-tokenz", "2048"], "vLLM 0.33.0 has no option --max-num-batched-tokenz"),
        # an abbreviation that fits several options is argparse's ambiguity error
        ([MODEL, "--max-num"], "ambiguous option: --max-num could match --max-num-batched-tokens"),
    ],
)
def test_unknown_options_fail_with_argparse_wording(argv: list[str], message: str) -> None:
    with pytest.raises(ValidationError) as exc:
        parse_argv(argv)
    assert message in str(exc.value)


def test_program_path_serve_and_underscores_are_normalised() -> None:
    words = ["/opt/venv/bin/vllm", "serve", MODEL, "--max_num_seqs=64", "--kv_cache_dtype", "fp8", "-tp", "2"]
    assert _normalise(words) == [MODEL, "--max-num-seqs=64", "--kv-cache-dtype", "fp8", "-tp", "2"]


@pytest.mark.parametrize(("text", "value"), [("2048", 2048), ("16k", 16000), ("16K", 16384), ("1m", 10**6)])
def test_lengths_take_vllm_suffixes(text: str, value: int) -> None:
    assert _human_int(text) == value


def test_a_bad_length_is_an_argparse_type_error() -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        _human_int("lots")


def test_ignored_vllm_options_are_accepted_by_shape() -> None:
    # shapes from the table: a value, a list (`list[int]`), a switch with its negation
    ns = parse_argv(
        [MODEL, "--dtype", "bfloat16", "--cudagraph-capture-sizes", "1", "2", "--no-enforce-eager"]
    )
    assert ns.ignored_dtype == "bfloat16"
    assert ns.ignored_cudagraph_capture_sizes == ["1", "2"]
    assert ns.ignored_enforce_eager is False
    assert ns.model_tag == MODEL and ns.sim_gpu == "H100-SXM" and ns.sim_time_scale == 1.0


def test_an_unambiguous_abbreviation_is_read_as_the_option() -> None:
    # FlexibleArgumentParser keeps argparse's allow_abbrev (the facts table's serve_flags.allow_abbrev)
    ns = parse_argv([MODEL, "--max-num-batched-tok", "4096", "--gpu-memory-util=0.8", "--sim-time-sc", "0.5"])
    assert (ns.max_num_batched_tokens, ns.gpu_memory_utilization, ns.sim_time_scale) == (4096, 0.8, 0.5)


@pytest.mark.parametrize(
    ("version", "argv", "note"),
    [
        # --swap-space is gone from 0.33's CacheConfig; --task from its ModelConfig
        (
            "0.33.0",
            ["--swap-space", "4"],
            "vLLM 0.33.0 has no option --swap-space; vLLM 0.11.0, 0.11.1, 0.11.2 have it",
        ),
        (
            "0.33.0",
            ["--task", "generate"],
            "vLLM 0.33.0 has no option --task; vLLM 0.11.0, 0.11.1, 0.11.2 have it",
        ),
        # 0.33's EnableDisableAction adds --disable-x beside --enable-x; 0.11 has only --no-enable-x
        (
            "0.11.0",
            ["--disable-prefix-caching"],
            "vLLM 0.11.0 has no option --disable-prefix-caching; vLLM 0.33.0 has it",
        ),
        ("0.11.0", ["--max-num-queued-tokens", "9"], "vLLM 0.11.0 has no option --max-num-queued-tokens"),
    ],
)
def test_an_option_the_pinned_release_lacks_is_refused_naming_it(
    version: str, argv: list[str], note: str
) -> None:
    with pytest.raises(ValidationError) as exc:
        parse_argv([MODEL, *argv, "--sim-vllm-version", version])
    assert f"unrecognized arguments: {argv[0]}" in str(exc.value)
    assert note in str(exc.value)


def test_each_release_accepts_its_own_spellings() -> None:
    old = parse_argv(
        [MODEL, "--swap-space", "4", "--no-enable-prefix-caching", "--sim-vllm-version", "0.11.0"]
    )
    assert old.ignored_swap_space == "4" and old.enable_prefix_caching is False
    new = parse_argv([MODEL, "--disable-prefix-caching", "--disable-chunked-prefill"])
    assert new.enable_prefix_caching is False and new.enable_chunked_prefill is False
    assert parse_argv([MODEL, "--enable-prefix-caching"]).enable_prefix_caching is True
    assert parse_argv([MODEL]).enable_prefix_caching is None  # unset: the release's default applies


def test_an_unknown_release_is_refused_before_its_options_are_read() -> None:
    with pytest.raises(ValidationError, match="--sim-vllm-version 0.20.0: the simulator models vLLM"):
        parse_argv([MODEL, "--swap-space", "4", "--sim-vllm-version", "0.20.0"])


def test_help_lists_the_simulator_options_and_hides_the_ignored_ones() -> None:
    text = build_parser().format_help()
    assert "--sim-vllm-version" in text and "--max-num-seqs" in text and "--swap-space" not in text

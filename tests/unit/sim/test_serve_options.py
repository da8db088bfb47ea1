"""The `serve` command line as argparse reads it: vLLM's spellings, ignored options, typos rejected."""

from __future__ import annotations

import argparse

import pytest

from pdfleet.errors import ValidationError
from pdfleet.sim.serve_options import _human_int, _normalise, parse_argv
from tests.unit.sim.helpers import MODEL


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([MODEL, "--max-num-batched-tokenz", "2048"], "unrecognized arguments: --max-num-batched-tokenz"),
        ([MODEL, "--max-num"], "unrecognized arguments: --max-num"),  # no abbreviations
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
    ns = parse_argv(
        [MODEL, "--dtype", "bfloat16", "--cudagraph-capture-sizes", "1", "2", "--no-enforce-eager"]
    )
    assert ns.ignored_dtype == "bfloat16"
    assert ns.ignored_cudagraph_capture_sizes == ["1", "2"]
    assert ns.ignored_enforce_eager is False
    assert ns.model_tag == MODEL and ns.sim_gpu == "H100-SXM" and ns.sim_time_scale == 1.0

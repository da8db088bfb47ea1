"""The `vllm serve` option set read from excerpts of 0.11.0's and 0.33.0's parser-building code
(tests/unit/tools/fixtures), as `make_arg_parser` builds it from `get_kwargs` and the annotations."""

from __future__ import annotations

import pytest

from pdfleet.model.vllm_releases import ServeFlag, ServeFlags
from tests.unit.tools.helpers import sources
from tools.vllm_ast import Sources
from tools.vllm_flags import serve_flags


@pytest.fixture(scope="module")
def old() -> ServeFlags:
    return serve_flags(sources("0.11.0"))


@pytest.fixture(scope="module")
def new() -> ServeFlags:
    return serve_flags(sources("0.33.0"))


def _by_name(flags: ServeFlags) -> dict[str, ServeFlag]:
    return {f.names[0]: f for g in flags.groups for f in g.flags}


def test_groups_name_the_files_and_the_parser(old: ServeFlags, new: ServeFlags) -> None:
    engine = "vllm/engine/arg_utils.py"
    assert [g.source for g in old.groups] == ["vllm/entrypoints/openai/cli_args.py", engine]
    assert [g.source for g in new.groups] == ["vllm/entrypoints/common/cli_args.py", engine]
    assert (old.source, new.source) == ("vllm/utils/__init__.py", "vllm/utils/argparse_utils.py")
    # FlexibleArgumentParser passes no allow_abbrev: argparse's default, abbreviations are accepted
    assert old.allow_abbrev and new.allow_abbrev


def test_make_arg_parser_options_and_short_names(old: ServeFlags, new: ServeFlags) -> None:
    assert _by_name(old)["--api-server-count"] == ServeFlag(("--api-server-count", "-asc"), "1", (), ("int",))
    assert _by_name(old)["--headless"] == ServeFlag(("--headless",), "0")  # store_true: no --no- form
    assert "--grpc" not in _by_name(old) and _by_name(new)["--grpc"].nargs == "0"


def test_frontend_fields_become_options_shaped_by_their_annotation(old: ServeFlags, new: ServeFlags) -> None:
    for flags in (old, new):
        f = _by_name(flags)
        assert f["--host"].nargs == f["--port"].nargs == "1"
        assert f["--api-key"].nargs == "+"  # list[str] | None
        assert f["--allowed-origins"].nargs == "1"  # `del frontend_kwargs["allowed_origins"]["nargs"]`
        assert f["--middleware"].nargs == "1"  # action "append", nargs deleted
    # 0.33's fields come from the base class too, and _customize_cli_kwargs keeps lora_modules a list
    assert _by_name(new)["--lora-modules"].nargs == "+"


def test_bool_fields_are_switches_with_their_negations(old: ServeFlags, new: ServeFlags) -> None:
    assert _by_name(old)["--enable-prefix-caching"] == ServeFlag(
        ("--enable-prefix-caching", "--no-enable-prefix-caching"),
        "0",
        ("--no-enable-prefix-caching",),
        ("bool",),
    )
    # 0.33's parser registers EnableDisableAction for BooleanOptionalAction: --enable-x pairs --disable-x
    negated = ("--no-enable-prefix-caching", "--disable-prefix-caching")
    assert _by_name(new)["--enable-prefix-caching"] == ServeFlag(
        ("--enable-prefix-caching", *negated), "0", negated, ("bool",)
    )
    assert "--enable-fastapi-docs" in _by_name(new)["--disable-fastapi-docs"].negatives


def test_engine_options_loops_and_aliases(old: ServeFlags, new: ServeFlags) -> None:
    f = _by_name(old)
    # SkipValidation[BlockSize] where BlockSize = Literal[...]: one value
    assert f["--block-size"].nargs == "1"
    # the deprecated guided-decoding loop, unrolled: `type=bool` still takes a value
    assert f["--guided-decoding-disable-fallback"] == ServeFlag(
        ("--guided-decoding-disable-fallback",), "1", (), ("bool",)
    )
    assert "--disable-log-requests" in f and "--disable-log-requests" not in _by_name(new)
    assert "--disable-log-requests" in _by_name(new)["--enable-log-requests"].negatives


def test_a_field_the_config_class_lacks_is_named() -> None:
    src = sources("0.33.0")
    files = dict(src.files)
    files["vllm/config/cache.py"] = files["vllm/config/cache.py"].replace("enable_prefix_caching", "x")
    with pytest.raises(KeyError, match="CacheConfig has no field enable_prefix_caching"):
        serve_flags(Sources("0.33.0", files))


def test_choices_and_types_from_the_annotation(old: ServeFlags, new: ServeFlags) -> None:
    """A Literal field's values are the option's choices (sorted by value, as literal_to_kwargs sorts them);
    `| str` beside the Literal makes them a metavar only (0.33's CacheDType | str): not enforced."""
    f, g = _by_name(old), _by_name(new)
    dtype = f["--kv-cache-dtype"]
    assert dtype.choices == ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc")
    assert dtype.types == ("Literal",) and dtype.choices_enforced
    wide = g["--kv-cache-dtype"]
    assert len(wide.choices) == 22 and {"float16", "nvfp4", "fp8_ds_mla"} <= set(wide.choices)
    assert wide.types == ("Literal", "str") and not wide.choices_enforced
    assert f["--block-size"].choices == ("1", "8", "16", "32", "64", "128")  # numerically sorted
    assert g["--block-size"].types == ("int",) and not g["--block-size"].choices
    assert f["--api-key"].types == ("list",)

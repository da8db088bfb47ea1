"""Annotations read as `get_kwargs` reads them: kinds, Literal values through aliases, explicit kwargs."""

from __future__ import annotations

import ast

from tools.vllm_types import aliases, hints, literals, sorted_text, typing_of

MODULE = ast.parse(
    'CacheDType = Literal["auto", "fp8"]\n'
    "BlockSize = Literal[1, 8, 16, 128]\n"
    "Wide: TypeAlias = CacheDType | str\n"
)


def _annotation(text: str) -> ast.expr:
    return ast.parse(text, mode="eval").body


def test_literals_follow_aliases_unions_and_wrappers() -> None:
    known = aliases(MODULE)
    assert literals(_annotation("CacheDType"), known) == ["auto", "fp8"]
    assert literals(_annotation("Optional[Wide]"), known) == ["auto", "fp8"]
    assert literals(_annotation("SkipValidation[BlockSize]"), known) == [1, 8, 16, 128]
    assert literals(_annotation("'CacheDType | None'"), known) == ["auto", "fp8"]  # a string annotation
    assert literals(_annotation("int"), known) == []
    assert set(hints(_annotation("Wide | None"), known)) == {"Literal", "str", "None"}


def test_choices_sort_as_vllm_sorts_them_and_explicit_kwargs_win() -> None:
    assert sorted_text([128, 8, 16, 1]) == ("1", "8", "16", "128")  # numbers numerically
    assert sorted_text(["fp8", "auto", "fp8"]) == ("auto", "fp8")
    call = _annotation("f(type=int, choices=['b', 'a'])")
    assert isinstance(call, ast.Call)
    kwargs = {kw.arg: kw.value for kw in call.keywords if kw.arg}
    assert typing_of(kwargs, {"str", "None"}, []) == (("int",), ("a", "b"))
    assert typing_of({}, {"Literal", "str", "None"}, ["x", "a"]) == (("Literal", "str"), ("a", "x"))

"""Prompt-token counting: every text the chat template puts in the prompt counts (issue 27 N6: tool
descriptions, tool-call arguments, `input_text` and untyped parts, `documents` and Anthropic tools were
free), and the estimate does not undercount CJK or emoji several-fold (N7)."""

from __future__ import annotations

from typing import Any

import pytest

from pdfleet.tokens import CharEstimate, count_messages_tokens, count_request_tokens, strings_of

EST = CharEstimate()
TEXT = "lorem ipsum dolor sit amet " * 150  # ~4050 characters: ~1000 tokens at 4 a token
HI = [{"role": "user", "content": "hi"}]


def _tools(description: str) -> list[dict[str, Any]]:
    params = {"type": "object", "properties": {"q": {"type": "string"}}}
    return [
        {"type": "function", "function": {"name": "search", "description": description, "parameters": params}}
    ]


HIDDEN: dict[str, dict[str, Any]] = {
    "tools[].function.description": {"messages": HI, "tools": _tools(TEXT)},
    "tool_calls[].function.arguments": {
        "messages": [
            *HI,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": TEXT}}
                ],
            },
        ]
    },
    "a part typed input_text": {
        "messages": [{"role": "user", "content": [{"type": "input_text", "text": TEXT}]}]
    },
    "an untyped part": {"messages": [{"role": "user", "content": [{"text": TEXT}]}]},
    "documents": {"messages": HI, "documents": [{"title": "t", "text": TEXT}]},
}


@pytest.mark.parametrize("where", list(HIDDEN))
def test_text_the_template_renders_counts(where: str) -> None:
    base = count_request_tokens({"messages": HI}, EST)
    assert count_request_tokens(HIDDEN[where], EST) - base >= 1000, where


def test_anthropic_tools_count() -> None:
    body: dict[str, Any] = {"model": "m", "max_tokens": 8, "messages": HI}
    base = count_messages_tokens(body, EST)
    tools = [{"name": "search", "description": TEXT, "input_schema": {"type": "object"}}]
    assert count_messages_tokens({**body, "tools": tools}, EST) - base >= 1000


def test_an_image_part_is_not_text_and_a_deep_value_is_counted_not_a_crash() -> None:
    image = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": TEXT}}]}]}
    assert count_request_tokens(image, EST) == count_request_tokens({"messages": [{"role": "user"}]}, EST)
    deep: Any = TEXT
    for _ in range(5000):
        deep = [deep]
    assert count_request_tokens({"messages": HI, "tools": deep}, EST) >= 1000
    assert strings_of({"a": [1, 2.5, True, None, "x"]}) == "a\n1\n2.5\nx"


def test_the_estimate_counts_cjk_and_emoji_by_their_bytes() -> None:
    assert EST.count("word " * 100) == 125  # ASCII: unchanged, chars / 4
    assert EST.count("漢字" * 500) == 1500  # 1000 CJK characters, 3 bytes each: 1.5 tokens each (was 250)
    assert EST.count("🙂" * 1000) == 2000  # 4 bytes each: 2 tokens (was 250)
    assert EST.count("naïve café") == 4  # 8 ASCII / 4 + two 2-byte letters / 2
    assert EST.count("\ud800") == 2  # a lone surrogate (JSON allows one) counts, no error

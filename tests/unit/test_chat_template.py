"""A chat request's prompt rendered as vLLM 0.33 renders it: where the template comes from, the
conversation handed to it (content format, tool calls, developer messages), transformers' render
settings, and what is refused or left to the caller."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pdfleet.chat_template import ChatTemplate, load_chat_template, to_conversation
from pdfleet.errors import ValidationError

SIMPLE = (
    "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}>{% endif %}"
)
PARTS = "{% for m in messages %}{% for p in m['content'] %}<{{ p['text'] }}>{% endfor %}{% endfor %}"


def _dir(path: Path, config: dict[str, Any], special: dict[str, Any] | None = None) -> str:
    path.mkdir(parents=True, exist_ok=True)
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    if special is not None:
        (path / "special_tokens_map.json").write_text(json.dumps(special))
    return str(path)


def test_the_template_and_special_tokens_come_from_the_tokenizer_files(tmp_path: Path) -> None:
    d = _dir(
        tmp_path,
        {
            "chat_template": "{{ bos_token }}{{ messages[0]['content'] }}{{ eos_token }}",
            "eos_token": {"content": "</e>"},
        },
        {"bos_token": "<b>", "eos_token": "</s>"},
    )
    template = load_chat_template(d)
    assert template is not None
    assert template.special == {"bos_token": "<b>", "eos_token": "</e>"}  # the config's wins, AddedToken read
    assert template.render({"messages": [{"role": "user", "content": "hi"}]}) == "<b>hi</e>"


def test_chat_template_jinja_wins_over_the_config_and_an_override_over_both(tmp_path: Path) -> None:
    d = _dir(tmp_path, {"chat_template": "config"})
    (tmp_path / "chat_template.jinja").write_text("file")
    body = {"messages": [{"role": "user", "content": "x"}]}
    assert load_chat_template(d).render(body) == "file"  # type: ignore[union-attr]
    assert load_chat_template(d, "given").render(body) == "given"  # type: ignore[union-attr]
    (tmp_path / "mine.jinja").write_text("from a file")
    assert load_chat_template(d, str(tmp_path / "mine.jinja")).render(body) == "from a file"  # type: ignore[union-attr]


def test_no_template_is_none(tmp_path: Path) -> None:
    assert load_chat_template(_dir(tmp_path, {"model_max_length": 10})) is None
    assert load_chat_template(str(tmp_path / "missing")) is None


def test_named_templates_pick_tool_use_for_a_request_with_tools(tmp_path: Path) -> None:
    named = [{"name": "default", "template": "plain"}, {"name": "tool_use", "template": "tools"}]
    template = load_chat_template(_dir(tmp_path, {"chat_template": named}))
    assert template is not None
    msgs = [{"role": "user", "content": "x"}]
    assert template.render({"messages": msgs}) == "plain"
    assert template.render({"messages": msgs, "tools": [{"type": "function"}]}) == "tools"


def test_string_content_joins_text_parts_and_the_generation_prompt_is_on_by_default() -> None:
    template = ChatTemplate({"default": SIMPLE})
    body = {
        "messages": [
            {"role": "system", "content": None},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, "b", {"type": "input_text", "text": "c"}],
            },
        ]
    }
    assert template.render(body) == "[system][user]a\nb\nc>"
    assert template.render({**body, "add_generation_prompt": False}) == "[system][user]a\nb\nc"


def test_a_template_that_iterates_content_gets_text_parts() -> None:
    template = ChatTemplate({"default": PARTS})
    body = {
        "messages": [
            {"role": "user", "content": "one"},
            {"role": "user", "content": [{"type": "text", "text": "two"}]},
        ]
    }
    assert template.render(body) == "<one><two>"


def test_what_is_not_rendered_here_is_none() -> None:
    template = ChatTemplate({"default": SIMPLE + "{{ tools }}"})
    image = {"type": "image_url", "image_url": {"url": "http://x"}}
    assert template.render({"messages": [{"role": "user", "content": [image]}]}) is None
    assert (
        template.render({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})
        is None
    )
    assert template.render({"messages": "not a list"}) is None
    plain = ChatTemplate(
        {"default": SIMPLE}
    )  # a template that never reads tools renders a request with tools
    assert (
        plain.render({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})
        == "[user]x>"
    )


def test_tool_calls_arguments_become_objects_and_tool_messages_keep_their_id() -> None:
    calls = [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
        {"id": "2", "type": "function", "function": {"name": "g", "arguments": "not json"}},
        {"id": "3", "type": "function", "function": {"name": "h", "arguments": "[1]"}},
    ]
    conversation = to_conversation(
        [
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": "1", "content": [{"type": "text", "text": "r"}], "name": "f"},
            {"role": "assistant", "content": "done", "tool_calls": []},
        ]
    )
    assert conversation is not None
    assert [c["function"]["arguments"] for c in conversation[0]["tool_calls"]] == [{"a": 1}, {}, {}]
    assert conversation[1] == {"role": "tool", "content": "r", "tool_call_id": "1", "name": "f"}
    assert "tool_calls" not in conversation[2]  # an empty list is dropped
    assert calls[0]["function"]["arguments"] == '{"a": 1}'  # the request's own body is left as it was
    rendered = ChatTemplate(
        {"default": "{{ messages[0]['tool_calls'][0]['function']['arguments'] | tojson }}"}
    )
    assert (
        rendered.render({"messages": [{"role": "assistant", "content": "", "tool_calls": calls[:1]}]})
        == '{"a": 1}'
    )


def test_developer_messages_become_one_system_message_unless_the_template_names_developer() -> None:
    msgs = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "developer", "content": "d"},
    ]
    assert ChatTemplate({"default": SIMPLE}).render({"messages": msgs}) == "[system]s\n\nd[user]u>"
    knows = ChatTemplate({"default": SIMPLE + "{# 'developer' #}"})
    assert knows.render({"messages": msgs}) == "[system]s[user]u[developer]d>"


def test_continue_final_message_cuts_after_the_last_message() -> None:
    template = ChatTemplate({"default": "{% for m in messages %}{{ m['content'] }}<end>{% endfor %}"})
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "partial "}]
    body = {"messages": msgs, "continue_final_message": True, "add_generation_prompt": False}
    assert template.render(body) == "q<end>partial "  # the template kept its spacing: so is it kept
    trimmed = ChatTemplate({"default": "{% for m in messages %}{{ m['content'] | trim }}<end>{% endfor %}"})
    assert trimmed.render(body) == "q<end>partial"


def test_request_kwargs_reach_the_template_and_its_refusals_are_validation_errors() -> None:
    template = ChatTemplate(
        {
            "default": "{% if effort == 'no' %}{{ raise_exception('effort no') }}{% endif %}"
            "{{ effort }}|{{ documents | length }}"
        }
    )
    msgs = [{"role": "user", "content": "x"}]
    assert (
        template.render({"messages": msgs, "chat_template_kwargs": {"effort": "hi"}, "documents": [{}, {}]})
        == "hi|2"
    )
    with pytest.raises(ValidationError, match="effort no"):
        template.render({"messages": msgs, "chat_template_kwargs": {"effort": "no"}})


def test_transformers_render_settings() -> None:
    """trim_blocks and lstrip_blocks, tojson without ASCII escapes, loop controls, the generation tag."""
    source = (
        "{% for m in messages %}\n"
        "    {% if loop.index > 1 %}{% break %}{% endif %}\n"
        "{% generation %}{{ m['content'] | tojson }}{% endgeneration %}\n"
        "{% endfor %}"
    )
    msgs = [{"role": "user", "content": "é"}, {"role": "user", "content": "second"}]
    assert ChatTemplate({"default": source}).render({"messages": msgs}) == '"é"'


def test_a_broken_template_is_refused() -> None:
    with pytest.raises(ValidationError, match="not a valid Jinja template"):
        ChatTemplate({"default": "{% for %}"})

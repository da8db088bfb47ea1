"""A chat request's prompt as the pinned vLLM release (0.33.0) renders it for /v1/chat/completions, so the
simulator prefills, and the gateway hashes, the token ids a real engine would (issue 32).

vLLM 0.33 (`vllm/renderers/hf.py`, `chat_utils/chat_message.py`, `online_renderer.py`):
- the template: `--chat-template` when given, else the tokenizer's: transformers reads
  `chat_template.jinja` beside the tokenizer, else `tokenizer_config.json`'s `chat_template` (a string,
  or named templates: `tool_use` when the request has tools and the model has one, else `default`);
  no template is an error in vLLM (transformers 4.44 dropped the default one): here, `None`.
- the conversation: each message's role and content; content parts of type text, input_text,
  output_text, refusal, thinking (or plain strings) joined by "\\n" when the template takes string
  content, kept as `{"type": "text", "text"}` parts when it iterates over a message's content (vLLM's
  detection of the "openai" content format, approximated: any `for` over an `X.content` /
  `X['content']` or over a name `content`); `name`, an assistant's `tool_calls` (arguments parsed from
  JSON to objects, invalid ones `{}`), a tool message's `tool_call_id` and its text joined; `developer`
  turned into `system` when the template never names "developer". A message with another kind of part
  (an image, audio...) is not rendered here (`None`: the caller falls back to its estimate).
- the render, as transformers' `apply_chat_template`: jinja2's immutable sandbox with trim_blocks and
  lstrip_blocks, loop controls, the `{% generation %}` tag, `tojson` without ASCII escaping,
  `raise_exception`, `strftime_now`; the special tokens (bos_token, eos_token...) in scope; the
  request's `chat_template_kwargs` under `add_generation_prompt` (default true),
  `continue_final_message`, `documents`, `reasoning_effort`; `tools` only when the template never
  reads them (vLLM passes its pydantic dump of each tool, which this does not rebuild: a request with
  tools is not rendered when the template reads `tools`).
- the ids: the rendered text tokenized without special tokens (`add_special_tokens` is false by
  default for chat; the template writes the BOS itself).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from pdfleet.errors import ValidationError

if TYPE_CHECKING:
    import jinja2
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# the content part types vLLM 0.33 renders as text (chat_message.py's _TEXT_CONTENT_PART_TYPES)
TEXT_PARTS = frozenset({"text", "input_text", "output_text", "refusal", "thinking"})
ContentFormat = Literal["string", "openai"]


def _raise(message: str) -> None:
    import jinja2

    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@functools.cache
def _environment() -> ImmutableSandboxedEnvironment:
    """transformers' rendering environment. jinja2 is imported here, not with the module: the host programs
    import this module, and only a host that renders a template (it runs the tokenizer) needs jinja2."""
    try:
        import jinja2
        import jinja2.ext
        import jinja2.nodes
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise ValidationError(
            "a chat template needs the jinja2 package, which is not installed here; install jinja2 "
            "(pdfleet's own dependency) beside the tokenizers package"
        ) from None

    class Generation(jinja2.ext.Extension):
        """transformers' `{% generation %}...{% endgeneration %}` tag, rendering its body as it is."""

        tags = {"generation"}

        def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return str(caller())

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def _iterates_content(ast: jinja2.nodes.Template) -> bool:
    """Whether a template loops over a message's content (vLLM's "openai" content format)."""
    import jinja2.nodes

    for loop in ast.find_all(jinja2.nodes.For):
        node = loop.iter
        while isinstance(node, jinja2.nodes.Filter | jinja2.nodes.Test) and node.node is not None:
            node = node.node
        if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
            node = node.node
        if isinstance(node, jinja2.nodes.Name) and node.name == "content":
            return True
        if isinstance(node, jinja2.nodes.Getattr) and node.attr == "content":
            return True
        arg = node.arg if isinstance(node, jinja2.nodes.Getitem) else None
        if isinstance(arg, jinja2.nodes.Const) and arg.value == "content":
            return True
    return False


@dataclass(frozen=True)
class ChatTemplate:
    """A model's chat template(s), compiled, with the special tokens its render sees."""

    templates: Mapping[str, str]  # name -> source ("default" for a single one)
    special: Mapping[str, Any] = field(default_factory=dict)
    _compiled: dict[str, jinja2.Template] = field(default_factory=dict, compare=False, repr=False)
    _facts: dict[str, tuple[ContentFormat, bool, frozenset[str]]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        import jinja2
        import jinja2.meta

        env = _environment()
        for name, source in self.templates.items():
            try:
                ast = env.parse(source)
                self._compiled[name] = env.from_string(source)
            except jinja2.TemplateError as exc:
                raise ValidationError(f"chat template {name!r}: not a valid Jinja template: {exc}") from None
            fmt: ContentFormat = "openai" if _iterates_content(ast) else "string"
            developer = '"developer"' in source or "'developer'" in source
            self._facts[name] = (fmt, developer, frozenset(jinja2.meta.find_undeclared_variables(ast)))

    def pick(self, tools: Any) -> str:
        """The template a request uses (transformers' get_chat_template)."""
        if len(self.templates) == 1:
            return next(iter(self.templates))
        if tools and "tool_use" in self.templates:
            return "tool_use"
        if "default" not in self.templates:
            raise ValidationError(f"no default chat template among {sorted(self.templates)}")
        return "default"

    def render(self, body: Mapping[str, Any]) -> str | None:
        """The prompt text a chat request becomes (None: not reproducible here, see the module docstring).
        A template's own error (raise_exception) is a ValidationError with its message."""
        messages, tools = body.get("messages"), body.get("tools")
        if not isinstance(messages, list):
            return None
        name = self.pick(tools)
        fmt, developer, names = self._facts[name]
        if tools and "tools" in names:
            return None
        conversation = to_conversation(messages, fmt, developer)
        if conversation is None:
            return None
        kwargs = dict(body.get("chat_template_kwargs") or {})
        extra = {
            "add_generation_prompt": body.get("add_generation_prompt", True),
            "continue_final_message": body.get("continue_final_message", False),
            "documents": body.get("documents"),
            "reasoning_effort": body.get("reasoning_effort"),
        }
        kwargs.update({k: v for k, v in extra.items() if v not in (None, "auto")})
        kwargs.pop("tokenize", None)
        kwargs.pop("chat_template", None)
        cont = bool(kwargs.pop("continue_final_message", False))
        gen = bool(kwargs.pop("add_generation_prompt", False))
        scope = {**self.special, **kwargs}
        import jinja2

        try:
            text = self._compiled[name].render(
                messages=conversation, tools=None, documents=kwargs.get("documents"),
                add_generation_prompt=gen, **{k: v for k, v in scope.items() if k != "documents"},
            )  # fmt: skip
        except jinja2.TemplateError as exc:
            raise ValidationError(f"the chat template rejected the request: {exc}") from None
        return _continue_final(text, conversation) if cont else text


def _continue_final(text: str, conversation: list[dict[str, Any]]) -> str:
    """transformers' continue_final_message: the render cut after the last message's content."""
    final = conversation[-1].get("content") if conversation else None
    if isinstance(final, list):
        texts = [p["text"] for p in final if isinstance(p, dict) and "text" in p]
        final = texts[-1] if texts else None
    if not isinstance(final, str) or final.strip() not in text:
        raise ValidationError("continue_final_message: the final message is not in the rendered prompt")
    at = text.rindex(final.strip())
    if text[at : at + len(final.lstrip())] == final:
        return text[: at + len(final.lstrip())]
    return text[: at + len(final.strip())]


def _texts(content: Any) -> list[str] | None:
    """A message content's text parts (None: a part that is not text)."""
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return None
    out = []
    for part in content:
        if isinstance(part, str):
            out.append(part)
        elif isinstance(part, dict) and part.get("type", "text") in TEXT_PARTS:
            text = part.get("text", part.get("refusal", part.get("thinking")))
            if text is None:
                continue  # vLLM skips a text part without content
            if not isinstance(text, str):
                return None
            out.append(text)
        else:
            return None
    return out


def _tool_calls(calls: Any) -> list[Any]:
    """An assistant's tool calls with their arguments as objects (vLLM's _postprocess_messages)."""
    out = []
    for call in calls:
        call = dict(call) if isinstance(call, dict) else call
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            function = dict(function)
            args = function.get("arguments")
            if not args:
                parsed: Any = {}
            elif isinstance(args, dict):
                parsed = args
            else:
                try:
                    parsed = json.loads(args) if isinstance(args, str) else args
                except json.JSONDecodeError:
                    parsed = {}
            function["arguments"] = parsed if isinstance(parsed, dict) else {}
            call["function"] = function
        out.append(call)
    return out


def to_conversation(
    messages: list[Any], fmt: ContentFormat = "string", developer: bool = True
) -> list[dict[str, Any]] | None:
    """The conversation vLLM hands the template (None: a message it renders from non-text parts)."""
    out: list[dict[str, Any]] = []
    for msg in messages:
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            return None
        role = msg["role"]
        texts = _texts(msg.get("content"))
        if texts is None:
            return None
        content: Any = "\n".join(texts)
        if fmt == "openai" and role != "tool":
            content = [{"type": "text", "text": t} for t in texts]
        turn: dict[str, Any] = {"role": role, "content": content}
        if role == "assistant" and msg.get("tool_calls") is not None:
            calls = msg["tool_calls"]
            if not isinstance(calls, list):
                return None
            if calls:
                turn["tool_calls"] = _tool_calls(calls)
        if role == "tool" and "tool_call_id" in msg:
            turn["tool_call_id"] = msg["tool_call_id"]
        if isinstance(msg.get("name"), str):
            turn["name"] = msg["name"]
        out.append(turn)
    if not developer and any(t["role"] == "developer" for t in out):
        out = _developer_as_system(out)
    return out


def _developer_as_system(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """vLLM's developer -> system conversion, the system messages then merged into one at the front."""
    turned = [{**t, "role": "system"} if t["role"] == "developer" else t for t in conversation]
    systems = [i for i, t in enumerate(turned) if t["role"] == "system"]
    if systems == [0] or not systems:
        return turned
    texts = []
    for i in systems:
        content = turned[i].get("content", "")
        if isinstance(content, list):
            content = "\n".join(p["text"] for p in content if isinstance(p, dict) and "text" in p)
        if content:
            texts.append(content)
    rest = [t for t in turned if t["role"] != "system"]
    return [{"role": "system", "content": "\n\n".join(texts)}, *rest]


def _token_text(value: Any) -> Any:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken object."""
    return value.get("content") if isinstance(value, dict) else value


def _read_json(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValidationError(f"{path}: cannot read it as JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ValidationError(f"{path}: not a JSON object")
    return doc


def load_chat_template(directory: str, override: str | None = None) -> ChatTemplate | None:
    """A tokenizer directory's chat template and special tokens (`override`: `--chat-template`, a file or
    the template itself); None when there is no template."""
    config_path = os.path.join(directory, TOKENIZER_CONFIG)
    config = _read_json(config_path) if os.path.isfile(config_path) else {}
    special_path = os.path.join(directory, SPECIAL_TOKENS_MAP)
    special = _read_json(special_path) if os.path.isfile(special_path) else {}
    special.update({k: config[k] for k in SPECIAL_KEYS if config.get(k) is not None})
    tokens = {k: _token_text(special[k]) for k in SPECIAL_KEYS if special.get(k) is not None}
    extra = special.get("additional_special_tokens")
    if isinstance(extra, list):
        tokens["additional_special_tokens"] = [_token_text(t) for t in extra]
    templates = _templates(directory, config, override)
    return ChatTemplate(templates, tokens) if templates else None


def _templates(directory: str, config: dict[str, Any], override: str | None) -> dict[str, str]:
    if override is not None:
        if os.path.isfile(override):
            with open(override, encoding="utf-8") as fh:
                return {"default": fh.read()}
        return {"default": override}
    jinja_file = os.path.join(directory, TEMPLATE_FILE)
    if os.path.isfile(jinja_file):
        with open(jinja_file, encoding="utf-8") as fh:
            return {"default": fh.read()}
    found = config.get("chat_template")
    if isinstance(found, str):
        return {"default": found}
    if isinstance(found, list):
        return {t["name"]: t["template"] for t in found if isinstance(t, dict) and "name" in t}
    return {}

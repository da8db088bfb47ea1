"""The token ids a chat request becomes on the engine, for an alias whose policy route names the model's
tokenizer directory (`tokenizer:`, issue 32): the model's chat template rendered as the pinned vLLM
release renders it and the model's tokenizer run over it (`pdfleet.chat_template`, `pdfleet.tokens`).

Those are the ids vLLM's KV events carry, so a text prompt's blocks match what an instance published
(without them the KV-events source counts a text prompt 0 cached: a lower bound); the prefix index cuts
them into the same blocks, and the prompt's length is the engine's own count. Rendering and tokenizing
run in a worker thread, never on the event loop (a 32K-token prompt takes milliseconds to tens of
milliseconds), and so does cutting the ids into the decider's chained block hashes (`prompt_blocks`:
milliseconds for 32K ids). What is not rendered here keeps the text path: completions (their ids depend on the
tokenizer's BOS handling), Anthropic Messages, a chat request with non-text parts or with tools the
template reads.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, NamedTuple

from pdfleet.chat_template import TOKENIZER_CONFIG, load_chat_template
from pdfleet.errors import ValidationError
from pdfleet.gateway.prefix_index import prompt_blocks
from pdfleet.tokens import HFTokenizer, chat_ids

TOKENIZER_FILE = "tokenizer.json"


def load_route_tokenizer(directory: str | None, source: Path, key: str) -> HFTokenizer | None:
    """A route's tokenizer and chat template from its directory (relative to the policy file), or
    ValidationError naming the policy file and `key` when the directory cannot render a chat prompt."""
    if directory is None:
        return None
    path = Path(directory) if Path(directory).is_absolute() else source.parent / directory
    where = f"{source}: {key}: {path}"
    if not (path / TOKENIZER_FILE).is_file():
        raise ValidationError(f"{where} holds no {TOKENIZER_FILE} (give the model's tokenizer directory)")
    template = load_chat_template(str(path))
    if template is None:
        raise ValidationError(
            f"{where} has no chat template (chat_template.jinja, or chat_template in {TOKENIZER_CONFIG}): "
            "vLLM refuses chat requests without one"
        )
    try:
        return HFTokenizer(path / TOKENIZER_FILE, template)
    except ValidationError as exc:
        raise ValidationError(f"{where}: {exc}") from None
    except Exception as exc:  # the tokenizers library raises its own exception types
        raise ValidationError(f"{where}: cannot load {TOKENIZER_FILE}: {exc}") from None


def engine_ids(tokenizer: HFTokenizer, data: dict[str, Any]) -> list[int] | None:
    """A chat body's prompt ids (None: not rendered here; a template's refusal, or a text the tokenizer
    cannot take, leaves the decision to the text path and the engine its own answer)."""
    try:
        return chat_ids(data, tokenizer)
    except (ValidationError, UnicodeError, TypeError, ValueError, RecursionError):
        return None


class EnginePrompt(NamedTuple):
    """A prompt as the engine prefills it: its token count and its ids' chained block hashes."""

    tokens: int
    blocks: list[int]


def engine_prompt(tokenizer: HFTokenizer, data: dict[str, Any], block_tokens: int) -> EnginePrompt | None:
    """A chat body's engine ids, counted and cut into blocks of `block_tokens` (None: not rendered)."""
    ids = engine_ids(tokenizer, data)
    return None if ids is None else EnginePrompt(len(ids), prompt_blocks(ids, block_tokens, 1.0))


async def prompt_ids(
    tokenizer: HFTokenizer | None, data: dict[str, Any], endpoint: str, block_tokens: int
) -> EnginePrompt | None:
    """A chat request's engine prompt on a route with a tokenizer, rendered and cut off the event loop."""
    if tokenizer is None or endpoint != "chat":
        return None
    return await asyncio.get_running_loop().run_in_executor(
        None, engine_prompt, tokenizer, data, block_tokens
    )

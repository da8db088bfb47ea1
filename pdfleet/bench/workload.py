"""What the simulator benches ask for: synthetic prompts of a given length and completion request bodies."""

from __future__ import annotations

import json

from pdfleet.tokens import DEFAULT_CHARS_PER_TOKEN

SIM_MODEL = "meta-llama/Llama-3.1-8B-Instruct"  # a model of the simulator's catalog


def synthetic_prompt(tokens: int, char: str = "x") -> str:
    """A prompt the simulator counts as `tokens` tokens (no tokenizer); another `char`: another prefix."""
    return char * round(DEFAULT_CHARS_PER_TOKEN * tokens)


def completion_body(
    prompt: str, max_tokens: int, model: str = SIM_MODEL, stream: bool = True, ignore_eos: bool = True
) -> bytes:
    """A /v1/completions request body; `ignore_eos` makes the output exactly `max_tokens` long."""
    body: dict[str, object] = {"model": model, "prompt": prompt, "max_tokens": max_tokens}
    if ignore_eos:
        body["ignore_eos"] = True
    if stream:
        body["stream"] = True
    return json.dumps(body).encode()

"""A local model directory as `vllm serve DIR` reads it: its `config.json` and its tokenizer's files.

A staged model (pdfleet.fleet.weights) is served from its revision's directory, and the simulator is
started the way vLLM is. From `config.json` it takes what vLLM takes that the simulator models: the
derived maximum model length (vLLM 0.11's `_get_and_verify_max_len`: the smallest of the length keys
present, Command-R's `model_max_length`, capped by `tokenizer_config.json`'s `model_max_length`, RoPE
scaling's factor; 2048 when none is there) and the architecture it logs. From `tokenizer.json` the
tokenizer that counts prompt tokens, when the `tokenizers` package (pdfleet[tokenizer]) is installed;
without it the file is read and checked and the simulator says that prompt tokens are estimated.
A directory without a readable `config.json` is refused with a message naming the file, as vLLM fails.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from pdfleet.errors import ValidationError

CONFIG_NAME = "config.json"
TOKENIZER_NAME = "tokenizer.json"
TOKENIZER_CONFIG_NAME = "tokenizer_config.json"
# vLLM 0.11 (vllm/config/model.py, _get_and_verify_max_len): the keys a config states its length in
LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
DEFAULT_MAX_LEN = 2048  # vLLM's, with a warning, when the config states no length
UNSCALED_ROPE = ("su", "longrope", "llama3")  # their lengths are stated already scaled


@dataclass(frozen=True)
class ModelDir:
    """What the simulator read from a local model directory."""

    path: str
    architectures: tuple[str, ...]
    max_len: int  # the derived max_model_len
    max_len_key: str  # where it came from ("default" when the config states none)
    tokenizer_file: str | None  # tokenizer.json, when the directory has one
    tokenizer_kind: str  # its model type and vocabulary size, for the log ("" without one)

    @property
    def config_file(self) -> str:
        return os.path.join(self.path, CONFIG_NAME)


def _read_json(path: str, what: str) -> dict[str, Any]:
    """A JSON object from a file, or ValidationError naming the file and what is wrong."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except FileNotFoundError:
        raise ValidationError(f"{path}: missing ({what})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValidationError(f"{path}: cannot read it ({what}): {exc}") from None
    except json.JSONDecodeError as exc:
        raise ValidationError(f"{path}: not JSON ({what}): {exc}") from None
    if not isinstance(doc, dict):
        raise ValidationError(f"{path}: not a JSON object ({what})")
    return doc


def derived_max_len(config: dict[str, Any], tokenizer_config: dict[str, Any] | None) -> tuple[int, str]:
    """vLLM's derived max_model_len of a config (and the tokenizer config's cap), with its key."""
    found = {k: config[k] for k in LENGTH_KEYS if isinstance(config.get(k), int | float)}
    if config.get("model_max_length"):
        found = {"model_max_length": config["model_max_length"]}  # Command-R: this one, not the smallest
    key = min(found, key=lambda k: found[k]) if found else "default"
    length = float(found[key]) if found else float(DEFAULT_MAX_LEN)
    cap = (tokenizer_config or {}).get("model_max_length")
    if isinstance(cap, int | float) and cap < length:
        length, key = float(cap), "tokenizer_config.json model_max_length"
    rope = config.get("rope_scaling")
    if found and isinstance(rope, dict):
        kind = rope.get("rope_type", rope.get("type"))
        if kind not in UNSCALED_ROPE:
            if kind == "yarn" and "original_max_position_embeddings" in rope:
                length = float(rope["original_max_position_embeddings"])
            length *= float(rope.get("factor", 1.0))
    return int(length), key


def _tokenizer_kind(path: str) -> str:
    """A tokenizer.json's model type and vocabulary size ('BPE, 262 tokens'); refused when unreadable."""
    doc = _read_json(path, "the model's tokenizer")
    model = doc.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("vocab"), dict | list):
        raise ValidationError(f"{path}: not a tokenizer.json (no model.vocab)")
    added = doc.get("added_tokens") or []
    return f"{model.get('type', '?')}, {len(model['vocab']) + len(added)} tokens"


def read_model_dir(path: str) -> ModelDir:
    """Read a local model directory's config and tokenizer files (ValidationError naming a bad file)."""
    config = _read_json(
        os.path.join(path, CONFIG_NAME), "the model's config: vLLM needs it in a local model directory"
    )
    tok_config_file = os.path.join(path, TOKENIZER_CONFIG_NAME)
    tok_config = (
        _read_json(tok_config_file, "the tokenizer's config") if os.path.exists(tok_config_file) else None
    )
    length, key = derived_max_len(config, tok_config)
    tok_file = os.path.join(path, TOKENIZER_NAME)
    has_tok = os.path.exists(tok_file)
    arch = config.get("architectures")
    return ModelDir(
        path=path,
        architectures=tuple(str(a) for a in arch) if isinstance(arch, list) else (),
        max_len=length,
        max_len_key=key,
        tokenizer_file=tok_file if has_tok else None,
        tokenizer_kind=_tokenizer_kind(tok_file) if has_tok else "",
    )


def can_run_tokenizers() -> bool:
    """Whether the `tokenizers` package (pdfleet[tokenizer]) is installed here."""
    try:
        import tokenizers  # noqa: F401 (only whether it imports)
    except ImportError:
        return False
    return True


def describe_dir(md: ModelDir, tokenizer_runs: bool) -> str:
    """The start-up log line: the files read and what the simulator uses them for."""
    arch = ",".join(md.architectures) or "no architectures"
    line = (
        f"pdfleet-sim: model config {md.config_file} ({arch}, {md.max_len_key}: max_model_len {md.max_len})"
    )
    if md.tokenizer_file is None:
        return line + f"; no {TOKENIZER_NAME} there: prompt tokens are estimated"
    use = (
        "counts prompt tokens"
        if tokenizer_runs
        else "read, not run (the tokenizers package, pdfleet[tokenizer], is not installed): "
        "prompt tokens are estimated"
    )
    return line + f"; tokenizer {md.tokenizer_file} ({md.tokenizer_kind}) {use}"

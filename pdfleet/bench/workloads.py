"""The benchmarks' workloads: seeded lists of prompts with input and output lengths, their length class,
and the completion request body every bench sends.

`random` (fixed or ranged lengths, as `vllm bench serve --dataset-name random`), `long-prompt-mix`
(mostly short chat turns plus a steady share of 16K-30K-token documents), `sharegpt` (a ShareGPT JSON
file, first turns, vLLM's length filter), `trace` (a Mooncake trace JSONL: timestamp ms, input_length,
output_length, hash_ids of 512-token prefix blocks), `prefix-repetition` (shared prefixes) and `agentic`
(multi-turn agent sessions whose context grows turn by turn: each turn's prompt is the previous one plus
100-800 new tokens, so its prefix is the session's history; see `agentic`). The same
seed gives the same list, so every pool of a run gets exactly the same requests. The simulator benches
ask for `synthetic_prompt`s instead: one repeated character, exactly the tokens the simulator counts.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdfleet.bench.trace import BLOCK_TOKENS, TraceRequest, read_trace
from pdfleet.errors import ValidationError
from pdfleet.tokens import DEFAULT_CHARS_PER_TOKEN

SIM_MODEL = "meta-llama/Llama-3.1-8B-Instruct"  # a model of the simulator's catalog
WORKLOADS = ("random", "long-prompt-mix", "sharegpt", "trace", "prefix-repetition", "agentic")
# Three-letter words plus a space: four characters, about one token for Llama's tokenizer and exactly one
# for the simulator's and the gateway's chars/4 estimate; drawn at random so prompts share no prefix.
_WORDS = [
    "the",
    "and",
    "for",
    "are",
    "but",
    "not",
    "you",
    "all",
    "any",
    "can",
    "had",
    "her",
    "was",
    "one",
    "our",
    "out",
    "day",
    "get",
    "has",
    "him",
    "his",
    "how",
    "man",
    "new",
    "now",
    "old",
    "see",
    "two",
    "way",
    "who",
    "boy",
    "did",
    "its",
    "let",
    "put",
    "say",
    "she",
    "too",
    "use",
    "art",
    "big",
    "car",
    "cat",
    "dog",
    "eye",
    "far",
    "fun",
    "god",
    "hat",
    "job",
    "key",
    "law",
    "map",
    "net",
    "oil",
    "pay",
    "red",
    "run",
    "sea",
    "sky",
    "sun",
    "top",
    "war",
    "win",
    "yes",
    "air",
    "arm",
    "bed",
    "box",
    "cup",
    "cut",
    "end",
    "few",
    "fix",
    "fly",
    "gas",
    "hot",
    "ice",
    "kid",
    "lot",
    "low",
    "mix",
    "nor",
    "odd",
    "own",
    "pen",
    "pie",
    "pig",
    "raw",
    "row",
    "set",
    "sit",
    "six",
    "son",
    "tea",
    "ten",
    "tie",
    "toy",
    "van",
    "web",
]
TRACE_BLOCK_TOKENS = BLOCK_TOKENS  # Mooncake traces: one hash_id per 512-token prefix block
SHAREGPT_MAX_PROMPT = 1024  # vLLM's is_valid_sequence: prompt <= 1024 tokens, prompt + output <= 2048
SHAREGPT_MAX_TOTAL = 2048
SHAREGPT_MIN = 4


@dataclass(frozen=True)
class Item:
    """One request of a workload: the prompt, its token count, the output length, a trace's own time."""

    index: int
    prompt: str
    prompt_tokens: int
    output_tokens: int
    at: float | None = None  # trace replay: seconds from the trace's first request
    session: str | None = None  # agentic: the session's id (sent as X-Session-Id, the gateway's sticky key)


@dataclass(frozen=True)
class WorkloadSpec:
    """What to generate; lengths in tokens. Defaults are `vllm bench serve`'s where it has one."""

    name: str = "long-prompt-mix"
    input_len: int = 1024
    output_len: int = 128
    range_ratio: float = 0.0  # random: lengths uniform in [len * (1 - r), len * (1 + r)]
    long_share: float = 0.25  # long-prompt-mix: share of 16K-30K-token documents (issue 26: 0.1 was too few)
    long_min: int = 16000
    long_max: int = 30000
    dataset: str | None = None  # sharegpt JSON or trace JSONL
    prefix_len: int = 256  # prefix-repetition (vLLM's defaults)
    suffix_len: int = 256
    num_prefixes: int = 10
    # agentic (issue 32): turns per session, the first turn's context, new tokens a turn, the context's
    # cap, the tool-call pause between a session's turns and the seconds between session starts
    turns: tuple[int, int] = (8, 20)
    first_context: tuple[int, int] = (8192, 16384)
    new_tokens: tuple[int, int] = (100, 800)
    max_context: int = 40000
    tool_pause_s: tuple[float, float] = (1.0, 5.0)
    session_gap_s: float = 2.0


def completion_body(
    prompt: str,
    max_tokens: int,
    model: str = SIM_MODEL,
    stream: bool = True,
    ignore_eos: bool = True,
    usage: bool = False,
) -> dict[str, Any]:
    """A /v1/completions request body; `ignore_eos` makes the output exactly `max_tokens` long, `usage`
    asks for the final usage event (what `vllm bench serve` sends for the random dataset: all three)."""
    body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": max_tokens}
    if ignore_eos:
        body["ignore_eos"] = True
    if stream:
        body["stream"] = True
    if stream and usage:
        body["stream_options"] = {"include_usage": True}
    return body


def synthetic_prompt(tokens: int, char: str = "x") -> str:
    """A prompt the simulator counts as `tokens` tokens (no tokenizer); another `char`: another prefix."""
    return char * round(DEFAULT_CHARS_PER_TOKEN * tokens)


def words(tokens: int, rng: random.Random) -> str:
    """A prompt of `tokens` random words, 4 characters each (no trailing space)."""
    return " ".join(rng.choice(_WORDS) for _ in range(max(1, tokens)))


def _ranged(rng: random.Random, length: int, ratio: float) -> int:
    """A length uniform in [length * (1 - ratio), length * (1 + ratio)]."""
    lo, hi = max(1, int(length * (1 - ratio))), max(1, int(length * (1 + ratio)))
    return rng.randint(lo, hi)


def check_spec(spec: WorkloadSpec) -> None:
    """Options that make no workload, and a dataset that cannot be read (a ValidationError names it)."""
    if spec.name not in WORKLOADS:
        raise ValidationError(
            f"--workload {spec.name!r}: not a workload; choose one of {', '.join(WORKLOADS)}"
        )
    if spec.input_len < 1 or spec.output_len < 1:
        raise ValidationError("--input-len and --output-len must be at least 1 token")
    if not 0 <= spec.range_ratio < 1:
        raise ValidationError(f"--range-ratio {spec.range_ratio}: must be in [0, 1)")
    if not 0 <= spec.long_share <= 1:
        raise ValidationError(f"--long-share {spec.long_share}: must be between 0 and 1")
    if spec.name in ("sharegpt", "trace") and not spec.dataset:
        raise ValidationError(
            "--workload sharegpt needs --dataset PATH (a ShareGPT JSON file)"
            if spec.name == "sharegpt"
            else "--workload trace needs --trace FILE (a Mooncake trace JSONL file)"
        )
    if spec.name in ("sharegpt", "trace") and not Path(str(spec.dataset)).expanduser().is_file():
        flag = "--trace" if spec.name == "trace" else "--dataset"  # the trace workload's file is --trace's
        raise ValidationError(f"{flag} {spec.dataset}: cannot read the file (not found)")


def build(spec: WorkloadSpec, n: int, seed: int) -> list[Item]:
    """`n` requests of the workload, the same for the same seed (a ValidationError names a bad option)."""
    check_spec(spec)
    rng = random.Random(seed)
    if spec.name == "random":
        return [
            _item(
                i,
                _ranged(rng, spec.input_len, spec.range_ratio),
                _ranged(rng, spec.output_len, spec.range_ratio),
                rng,
            )
            for i in range(n)
        ]
    if spec.name == "long-prompt-mix":
        return [_mix_item(i, spec, rng) for i in range(n)]
    if spec.name == "agentic":
        return agentic(spec, n, rng)
    if spec.name == "prefix-repetition":
        prefixes = [words(spec.prefix_len, rng) for _ in range(max(1, spec.num_prefixes))]
        return [_prefixed(i, prefixes[i % len(prefixes)], spec, rng) for i in range(n)]
    path = Path(str(spec.dataset)).expanduser()
    if spec.name == "sharegpt":
        return sharegpt(path, n, rng)
    return trace(path, n)


def _item(index: int, prompt_tokens: int, output_tokens: int, rng: random.Random) -> Item:
    """An item with a random-word prompt of `prompt_tokens` tokens."""
    return Item(index, words(prompt_tokens, rng), prompt_tokens, output_tokens)


def _mix_item(index: int, spec: WorkloadSpec, rng: random.Random) -> Item:
    """A short chat turn (input_len ± 50%), or with probability long_share a 16K-30K-token document."""
    if rng.random() < spec.long_share:
        return _item(index, rng.randint(spec.long_min, spec.long_max), spec.output_len, rng)
    return _item(index, _ranged(rng, spec.input_len, 0.5), _ranged(rng, spec.output_len, 0.5), rng)


def _prefixed(index: int, prefix: str, spec: WorkloadSpec, rng: random.Random) -> Item:
    """A shared prefix plus a random suffix."""
    suffix = words(spec.suffix_len, rng)
    return Item(index, f"{prefix} {suffix}", spec.prefix_len + spec.suffix_len, spec.output_len)


def agentic(spec: WorkloadSpec, n: int, rng: random.Random) -> list[Item]:
    """`n` turns of agent sessions, in the order they arrive (`at`, seconds): sessions start
    `session_gap_s` apart; a session's first prompt is `first_context` tokens, each later one is the
    previous prompt plus `new_tokens` (the tool's result and the next ask) up to `max_context`; turns are
    a tool-call pause plus the turn's nominal time (its new tokens at 1000 tokens/s, its output at
    50 tokens/s) apart. A session's prompts share its history as their prefix, and no other session's."""
    items: list[Item] = []
    session = 0
    while len(items) < n:
        sid = f"agent-{session}"
        t = session * spec.session_gap_s
        context = words(rng.randint(*spec.first_context), rng)
        tokens = len(context.split(" "))
        for _ in range(rng.randint(*spec.turns)):
            out = _ranged(rng, spec.output_len, 0.5)
            items.append(Item(0, context, tokens, out, t, sid))
            new = min(rng.randint(*spec.new_tokens), spec.max_context - tokens)
            if new <= 0:
                break
            context = f"{context} {words(new, rng)}"
            tokens += new
            t += rng.uniform(*spec.tool_pause_s) + new / 1000 + out / 50
        session += 1
    items.sort(key=lambda it: it.at or 0.0)
    return [
        Item(i, it.prompt, it.prompt_tokens, it.output_tokens, it.at, it.session)
        for i, it in enumerate(items[:n])
    ]


def _read(path: Path, what: str) -> str:
    """A dataset file's text, or an error naming it."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as err:
        raise ValidationError(f"--dataset {path}: cannot read the {what} ({err.strerror})") from None


def estimate_tokens(text: str) -> int:
    """Tokens of a text as the simulator and the gateway count without a tokenizer (4 characters each)."""
    return -(-len(text) // 4)


def sharegpt(path: Path, n: int, rng: random.Random) -> list[Item]:
    """First turns of a ShareGPT JSON file, shuffled by the seed, filtered as vLLM's is_valid_sequence."""
    try:
        data = json.loads(_read(path, "ShareGPT JSON file"))
    except ValueError as err:
        raise ValidationError(f"--dataset {path}: not JSON ({err})") from None
    if not isinstance(data, list):
        raise ValidationError(f"--dataset {path}: a ShareGPT file is a JSON list of conversations")
    turns = []
    for entry in data:
        conv = entry.get("conversations") if isinstance(entry, dict) else None
        if isinstance(conv, list) and len(conv) >= 2 and all(isinstance(c, dict) for c in conv[:2]):
            prompt, answer = str(conv[0].get("value", "")), str(conv[1].get("value", ""))
            p, o = estimate_tokens(prompt), estimate_tokens(answer)
            if (
                p >= SHAREGPT_MIN
                and o >= SHAREGPT_MIN
                and p <= SHAREGPT_MAX_PROMPT
                and p + o <= SHAREGPT_MAX_TOTAL
            ):
                turns.append((prompt, p, o))
    if not turns:
        raise ValidationError(
            f"--dataset {path}: no conversation with a first turn vLLM's filter keeps "
            f"(prompt {SHAREGPT_MIN}-{SHAREGPT_MAX_PROMPT} tokens, total <= {SHAREGPT_MAX_TOTAL})"
        )
    rng.shuffle(turns)
    return [Item(i, *turns[i % len(turns)]) for i in range(n)]


def _block(hash_id: int) -> list[str]:
    """The 512 words of one trace prefix block: the same hash_id, the same text (prefix reuse kept)."""
    rng = random.Random(f"mooncake-block-{hash_id}")
    return [rng.choice(_WORDS) for _ in range(TRACE_BLOCK_TOKENS)]


def trace_prompt(request: TraceRequest, salt: str) -> str:
    """A prompt of the request's `input_length` words whose blocks follow its hash_ids (equal ids: equal
    text, so prefixes shared in the trace stay shared), the rest words seeded by `salt`; never the
    captured text, which no trace holds."""
    text: list[str] = []
    for h in request.hash_ids:
        if len(text) >= request.input_length:
            break
        text += _block(h)
    rest = random.Random(salt)
    text += [rest.choice(_WORDS) for _ in range(max(0, request.input_length - len(text)))]
    return " ".join(text[: request.input_length])


def trace(path: Path, n: int) -> list[Item]:
    """The first `n` requests of a Mooncake trace JSONL (pdfleet.bench.trace), in arrival order, at their
    own times (s from the first); an output length of 0 (a captured request cut before its first token)
    is sent as 1."""
    try:
        requests = read_trace(path, limit=n)
    except ValidationError as err:
        raise ValidationError(f"--dataset {err}") from None
    t0 = requests[0].timestamp
    return [
        Item(
            i,
            trace_prompt(r, f"{path.name}-{i}"),
            r.input_length,
            max(1, r.output_length),
            (r.timestamp - t0) / 1000,
        )
        for i, r in enumerate(requests)
    ]

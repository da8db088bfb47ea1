"""The decider's cost on the gateway's request path (rerunnable; not a test): `python bench/decider_cost.py`.

Times `Deciding.route` (what intake calls once per request after counting tokens: the prompt's text and
block hashes, the prefix index's lookups on every colocated instance and the record on the chosen one,
the queue facts, the pure decision) for chat requests of `--tokens` estimated tokens (default 32K; 4
characters a token, tokenization excluded), one agent session growing turn by turn so the index holds
its prefix, against the routing before the decider (whole prompt, round robin: no index) on the same
requests. Prints P50, P99 and max per setting, in microseconds.

`--tokenizer DIR` (a model's tokenizer directory with its chat template, as a policy route's
`tokenizer:`) adds the decider on the engine's ids (the blocks cut from the rendered, tokenized prompt,
as the gateway does for such a route under KV events) and, apart, what rendering and tokenizing each
prompt cost (`pdfleet.gateway.prompt_ids.engine_ids`, run in a worker thread by the gateway, off the
event loop).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from pdfleet.gateway.deciding import Deciding
from pdfleet.gateway.policy import ActivePolicy, load_policy
from pdfleet.gateway.prompt_ids import EnginePrompt, engine_prompt, load_route_tokenizer
from pdfleet.model.routing import DeciderSpec

SETTINGS: dict[str, dict[str, Any]] = {
    "before the decider (prompt, round_robin)": {},
    "decider (effective, prefix_load, bypass bound)": {
        "threshold_on": "effective",
        "colocated_choice": "prefix_load",
        "prefill_busy_waiting": 8,
    },
}


def _policy(directory: Path, decider: dict[str, Any], instances: int) -> ActivePolicy:
    """A policy with one alias over `instances` colocated URLs and a P/D pool (nothing listens)."""
    (directory / "keys.yaml").write_text(yaml.safe_dump({"keys": [{"name": "k", "sha256": "0" * 64}]}))
    route: dict[str, Any] = {
        "colocated": [f"http://127.0.0.1:{9000 + i}" for i in range(instances)],
        "disagg": "http://127.0.0.1:8999",
    }
    if "prefill_busy_waiting" in decider:
        route["prefill"] = ["http://127.0.0.1:8998"]
    doc = {
        "version": 1,
        "keys_file": "keys.yaml",
        "models": {"m": route},
        "stage": "all",
        "stages": {"all": {"short": 0, "long": 100}},
        "decider": decider,
    }
    (directory / "keys.yaml").chmod(0o600)
    path = directory / "policy.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_policy(path)


def _requests(tokens: int, turns: int, new_tokens: int) -> list[tuple[dict[str, Any], int]]:
    """`turns` requests of about `tokens` tokens each: one shared context (cached after the first) and
    `new_tokens` of its own each, as an agent session's turns are."""
    out = []
    words = max(1, (tokens - new_tokens) * 4 // 5)  # 5-character words at 4 characters a token
    context = "".join(f"w{i % 1000:03d} " for i in range(words))
    for turn in range(turns):
        text = context + "".join(f"n{turn % 10}{j % 100:02d} " for j in range(new_tokens * 4 // 5))
        body = {"model": "m", "messages": [{"role": "user", "content": text}]}
        out.append((body, len(text) // 4))
    return out


def measure(
    decider: dict[str, Any],
    requests: list[tuple[dict[str, Any], int]],
    instances: int,
    ids: list[EnginePrompt] | None = None,
) -> list[float]:
    """Microseconds per `route` call, one per request (the first one fills the index); `ids`: each
    request's engine ids, given to `route` as the gateway gives them for a route with a tokenizer."""
    with tempfile.TemporaryDirectory() as tmp:
        policy = _policy(Path(tmp), decider, instances)
    deciding = Deciding(policy)
    route = policy.routes["m"]
    out = []
    for i, (body, tokens) in enumerate(requests):
        given = None if ids is None else ids[i]
        n = tokens if given is None else given.tokens
        t0 = time.perf_counter()
        deciding.route(policy, route, body, "chat", n, "s:session", None, ids=given)
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def tokenize(
    directory: str, requests: list[tuple[dict[str, Any], int]], block_tokens: int
) -> tuple[list[EnginePrompt], list[float]]:
    """Each request's engine prompt (chat template rendered, tokenized, cut into blocks, as the gateway's
    worker thread does) and microseconds per request."""
    tokenizer = load_route_tokenizer(directory, Path("bench"), "--tokenizer")
    assert tokenizer is not None
    out, times = [], []
    for body, _ in requests:
        t0 = time.perf_counter()
        ids = engine_prompt(tokenizer, body, block_tokens)
        times.append((time.perf_counter() - t0) * 1e6)
        if ids is None:
            raise SystemExit(f"--tokenizer {directory}: the chat template did not render the request")
        out.append(ids)
    return out, times


def _row(name: str, times: list[float]) -> str:
    p99 = statistics.quantiles(times, n=100)[98]
    return f"| {name} | {statistics.median(times):.0f} | {p99:.0f} | {max(times):.0f} |"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=32768, help="estimated prompt tokens (default 32768)")
    p.add_argument("--turns", type=int, default=400, help="requests timed per setting (default 400)")
    p.add_argument("--new-tokens", type=int, default=200, help="tokens each turn adds (default 200)")
    p.add_argument("--instances", type=int, default=4, help="colocated instances (default 4)")
    p.add_argument(
        "--tokenizer",
        help="a model's tokenizer directory with its chat template: also time the decider on the "
        "engine's ids, and the rendering and tokenizing apart (default: text only)",
    )
    args = p.parse_args()
    if min(args.tokens, args.turns, args.new_tokens, args.instances) < 1:
        p.error("--tokens, --turns, --new-tokens and --instances must be >= 1")
    requests = _requests(args.tokens, args.turns, args.new_tokens)
    print(f"{args.turns} requests of {requests[0][1]} tokens, {args.instances} colocated instances")
    print("| setting | p50 us | p99 us | max us |")
    print("|---|---|---|---|")
    for name, decider in SETTINGS.items():
        print(_row(name, measure(decider, requests, args.instances)))
    if args.tokenizer:
        ids, times = tokenize(args.tokenizer, requests, DeciderSpec().block_tokens)
        decider = SETTINGS["decider (effective, prefix_load, bypass bound)"]
        name = f"decider on the engine's ids ({ids[0].tokens} ids)"
        print(_row(name, measure(decider, requests, args.instances, ids)))
        print(_row("apart, in a worker thread: chat template rendered, tokenized, cut into blocks", times))
    return 0


if __name__ == "__main__":
    sys.exit(main())

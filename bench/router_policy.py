#!/usr/bin/env python3
"""vllm-router P/D policy benchmark (rerunnable; not a test): `python bench/router_policy.py`.

Measures, in one run on this machine, what each selection policy of the real vllm-router (the
installed PyPI wheel, in --vllm-pd-disaggregation mode) adds to time-to-first-token over the same
simulator P/D pool, for long prompts (~23K tokens, RAG/agent size) and short ones (~500):
- one router per policy runs at once over the same prefill and decode simulators on 127.0.0.1;
- each round sends one request per prompt class through every router (and `direct`, the client
  running the prefill -> decode protocol itself), one at a time, the order rotated each round;
- every request has its own prompt (seeded random words), so no prefix is ever shared: the cost a
  policy adds is its own work per request, not a cache effect;
- added TTFT = TTFT through the policy's router minus through round_robin's in the same round
  (paired, so the shared machine's drift cancels); p50 and p90 over the rounds, and the p50 of each
  half of the rounds (a policy whose state grows with traffic gets slower in the second half;
  --fill sends that traffic first);
- router CPU ms per request, from /proc around each request (the noise-free view of the same cost).
The default pool is the layout the shipped profiles render (one prefill, one decode instance: every
policy then picks the same workers, so cost is all that differs); --prefill/--decode change it.
`gateway.router_policy` in a profile selects the policy the rendered vllm-router-pd.service uses.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pdfleet.bench.router_policy import BASELINE, PolicyConfig, report_lines, run_benchmark
from pdfleet.model.profile import ROUTER_POLICIES


def positive_int(text: str) -> int:
    """An argparse type: an integer > 0."""
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def policy_list(text: str) -> tuple[str, ...]:
    """An argparse type: comma-separated NAME or PREFILL/DECODE policy specs, round_robin (the baseline)
    first; every name one vllm-router accepts in P/D mode."""
    specs = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for spec in specs for n in spec.split("/") if n not in ROUTER_POLICIES]
    if bad or any(spec.count("/") > 1 for spec in specs):
        raise argparse.ArgumentTypeError(
            f"not NAME or PREFILL/DECODE with vllm-router policies: {text}; "
            f"names: {', '.join(ROUTER_POLICIES)}"
        )
    return (BASELINE, *(n for n in specs if n != BASELINE))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--policies",
        type=policy_list,
        default=policy_list(",".join(ROUTER_POLICIES)),
        help="comma-separated policies to compare, each NAME (both pools) or PREFILL/DECODE "
        "(e.g. cache_aware/round_robin); default: every one vllm-router 0.1.17 accepts in P/D "
        "mode; round_robin, the baseline, is always included",
    )
    p.add_argument("--rounds", type=positive_int, default=20, help="measured rounds (default 20)")
    p.add_argument("--warmup", type=int, default=2, help="unmeasured rounds first (default 2)")
    p.add_argument(
        "--fill",
        type=int,
        default=0,
        help="unmeasured distinct long prompts sent through each router first, 4 at a time, "
        "so that per-prompt state (cache_aware's prefix tree) is that of a fleet which has "
        "served traffic (default 0)",
    )
    p.add_argument(
        "--long-tokens",
        type=positive_int,
        default=23000,
        help="prompt tokens of the long class (default 23000)",
    )
    p.add_argument(
        "--short-tokens",
        type=positive_int,
        default=500,
        help="prompt tokens of the short class (default 500)",
    )
    p.add_argument("--max-tokens", type=positive_int, default=4, help="output tokens per request (default 4)")
    p.add_argument(
        "--endpoint",
        choices=["completions", "chat"],
        default="completions",
        help="/v1/completions (default) or /v1/chat/completions (one user message)",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=0.05,
        help="the simulators' wall seconds per simulated second (default 0.05: the GPU work "
        "is short next to what the routers add)",
    )
    p.add_argument("--prefill", type=positive_int, default=1, help="prefill instances (default 1)")
    p.add_argument("--decode", type=positive_int, default=1, help="decode instances (default 1)")
    p.add_argument("--no-direct", action="store_true", help="leave out the router-less `direct` target")
    p.add_argument("--seed", type=int, default=1, help="seed of the prompts (default 1)")
    p.add_argument("--json", type=Path, help="also write the summary rows and settings here")
    args = p.parse_args()
    cfg = PolicyConfig(
        policies=args.policies,
        classes=(("long", args.long_tokens), ("short", args.short_tokens)),
        rounds=args.rounds,
        warmup=args.warmup,
        fill=args.fill,
        max_tokens=args.max_tokens,
        endpoint=args.endpoint,
        time_scale=args.time_scale,
        prefill=args.prefill,
        decode=args.decode,
        direct=not args.no_direct,
        seed=args.seed,
    )
    rows = run_benchmark(cfg)
    print()
    print("\n".join(report_lines(rows, cfg)))
    if args.json:
        settings = {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(cfg).items()}
        args.json.write_text(json.dumps({"settings": settings, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

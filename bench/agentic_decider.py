"""Length-only routing against the decider on an agentic load, on simulators on loopback (issue 32).

Two arms, each on a fresh loopback fleet (`pdfleet.bench.local_fleet`: two colocated simulators, a prefill
and a decode simulator behind the real vllm-router, the gateway), the stage sending every long prompt to
the P/D pool (`long: 100`), the same seeded agent sessions at the same times without the pool header:

- `length-only`: `decider: {threshold_on: prompt, colocated_choice: round_robin}` (the routing before it);
- `decider`: `decider: {threshold_on: effective, colocated_choice: prefix_load}`.

Most sessions start under the long threshold (3-12K tokens against 8192) and grow past it turn by
turn, as agents do, so the decider has a choice: keep a session on the instance that holds its history
(`cached_prefix`) or, by length, send it to the P/D pool, which then prefills and moves the whole context
once and its growth after. A session whose first turn is already long (uncached) goes to the P/D pool in
both arms, and stays there: its history is cached there, on no colocated instance.

Per arm: KV-transfer tokens into the decode instance (`vllm:prompt_tokens_by_source{source=
"external_kv_transfer"}`) and NIXL bytes; short streams' stalls on the colocated pool (gaps over the
stall bound, per 100 streams); TTFT P50/P95 of the sessions' first turns, of the long ones among them
(long and uncached: the P/D pool's own case) and of every long request; the decider's reason mix;
failures. Times are simulated (wall / --time-scale).

    PYTHONPATH=. .venv/bin/python bench/agentic_decider.py [--turns 160] [--seed 32] [--time-scale 0.25]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from pdfleet.bench.load import Gateway, PoolRun, Schedule, run_pool
from pdfleet.bench.local_fleet import LocalFleet
from pdfleet.bench.stats import gaps, quantile
from pdfleet.bench.workloads import Item, WorkloadSpec, build
from pdfleet.gateway.decider import reason_mix_text

LONG_TOKENS = 8192
STAGES = {"colocated": {"short": 0, "long": 0}, "long-prompts": {"short": 0, "long": 100}}
ARMS = {
    "length-only": {"threshold_on": "prompt", "colocated_choice": "round_robin"},
    "decider": {"threshold_on": "effective", "colocated_choice": "prefix_load"},
}
STALL_S = 0.25  # a gap the client sees as the typewriter stopping (the lab profiles' slo.stall_ms)


def workload() -> WorkloadSpec:
    """Agent sessions of 8-20 turns from 3-12K tokens of context, 100-800 new tokens a turn, up to 24K."""
    return WorkloadSpec(
        name="agentic",
        output_len=64,
        turns=(8, 20),
        first_context=(3000, 12000),
        new_tokens=(100, 800),
        max_context=24000,
        tool_pause_s=(1.0, 3.0),
        session_gap_s=1.5,
    )


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of an exposition page."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:  # noqa: S310 - loopback only
        text = r.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def total(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls))


def run_arm(items: list[Item], decider: dict[str, str], scale: float) -> dict[str, Any]:
    """One arm on a fresh fleet: the load, then the fleet's own counters."""
    policy = {"stage": "long-prompts", "stages": STAGES, "decider": decider}
    sim = ["--sim-time-scale", f"{scale:g}"]
    with LocalFleet(colocated=2, sim_args=sim, long_tokens=LONG_TOKENS, policy=policy) as fleet:
        gw: Gateway = fleet.gateway
        schedule = Schedule(starts=[(it.at or 0.0) * scale for it in items], drain_s=300)
        run = asyncio.run(
            run_pool(gw, "colocated", items, schedule, LONG_TOKENS, asyncio.Event(), forced=False)
        )
        assert fleet.decode is not None
        decode = scrape(fleet.decode.url)
        gateway = scrape(f"http://127.0.0.1:{gw.port}")  # the loopback fleet's gateway
    return figures(items, run, decode, gateway, scale)


def figures(
    items: list[Item],
    run: PoolRun,
    decode: dict[tuple[str, frozenset[tuple[str, str]]], float],
    gateway: dict[tuple[str, frozenset[tuple[str, str]]], float],
    scale: float,
) -> dict[str, Any]:
    """The arm's figures from its records and the counters read after it."""
    first = {it.index for it in items if it.index == min(j.index for j in items if j.session == it.session)}
    recs = run.records
    colocated_short = [r for r in recs if r.instance is not None and r.length_class == "short" and r.chunks]
    stalls = sum(sum(g > STALL_S for g in gaps(r, scale)) for r in colocated_short)

    def ttft(sel: list[Any]) -> dict[str, float | None]:
        xs = sorted(r.ttft / scale for r in sel if r.chunks)
        return {f"p{q}": (1000 * quantile(xs, q / 100) if xs else None) for q in (50, 95)}

    reasons = {
        dict(ls)["reason"]: v for (n, ls), v in gateway.items() if n == "pdfleet_gateway_decisions_total"
    }
    return {
        "requests": len(recs),
        "failed": sum(1 for r in recs if not r.success),
        "to_pd": sum(1 for r in recs if r.success and r.instance is None),
        "kv_tokens_moved": total(decode, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer"),
        "nixl_bytes": total(decode, "vllm:nixl_bytes_transferred_sum"),
        "colocated_short_streams": len(colocated_short),
        "stalls_per_100_short_streams": 100 * stalls / len(colocated_short) if colocated_short else None,
        "first_turn_ttft_ms": ttft([r for r in recs if r.index in first]),
        "long_uncached_ttft_ms": ttft([r for r in recs if r.index in first and r.length_class == "long"]),
        "long_uncached": sum(1 for r in recs if r.index in first and r.length_class == "long"),
        "long_ttft_ms": ttft([r for r in recs if r.length_class == "long"]),
        "reasons": reasons,
        "reason_mix": reason_mix_text(reasons),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--turns", type=int, default=160, help="Requests (agent turns) per arm (default 160).")
    ap.add_argument("--seed", type=int, default=32, help="The workload's seed (default 32).")
    ap.add_argument(
        "--time-scale",
        type=float,
        default=0.25,
        help="Wall seconds per simulated second, for the simulators and the schedule (default 0.25).",
    )
    args = ap.parse_args()
    if args.turns < 1 or not 0 < args.time_scale <= 1:
        raise SystemExit("--turns must be at least 1 and --time-scale in (0, 1]")
    items = build(workload(), args.turns, args.seed)
    out = {arm: run_arm(items, decider, args.time_scale) for arm, decider in ARMS.items()}
    print(json.dumps(out, indent=2))
    base, new = out["length-only"]["kv_tokens_moved"], out["decider"]["kv_tokens_moved"]
    if base:
        fewer = 100 * (1 - new / base)
        print(f"KV tokens moved: decider {new:.0f} vs length-only {base:.0f} ({fewer:.0f}% fewer)")


if __name__ == "__main__":
    main()

"""Router-policy benchmark: TTFT through vllm-router in P/D mode per selection policy, against round_robin.

One simulator P/D pool (prefill and decode instances on loopback) behind one real `vllm-router` per
policy, all running at once. Each round sends, per prompt class (long, short), one request through
every target in turn (the order rotated each round), one request at a time, each with a prompt of its
own (seeded random words of the class's length, so neither the routers' prefix trees nor the
simulators' caches ever match). A policy's added TTFT is its TTFT minus round_robin's in the same
round and class (paired: drift of the shared machine cancels). `direct` is the client running the
P/D protocol itself (prefill with `kv_transfer_params`, then the decode stream), the no-router floor.
The router's CPU time per request comes from /proc around each request. `bench/router_policy.py` is
the script.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field

from pdfleet.bench.client import Record, StreamClient, request_bytes
from pdfleet.bench.cpu import cpu_seconds
from pdfleet.bench.launch import RouterProcess, SimProcess
from pdfleet.bench.procs import free_port
from pdfleet.bench.report import markdown_table
from pdfleet.bench.stats import NAN, pct_ms
from pdfleet.bench.workloads import SIM_MODEL
from pdfleet.model.specs import RouterPolicy
from pdfleet.tokens import DEFAULT_CHARS_PER_TOKEN

BASELINE = "round_robin"
DIRECT = "direct"
KV_CONFIG = '{"kv_connector":"NixlConnector","kv_role":"%s"}'
_ALPHABET = "abcdefghijklmnopqrstuvwxyz" + " " * 5  # words of ~5 letters on average


@dataclass(frozen=True)
class PolicyConfig:
    """The benchmark's settings (the script's options of the same names)."""

    policies: tuple[str, ...]  # NAME (both pools) or PREFILL/DECODE, e.g. cache_aware/round_robin
    classes: tuple[tuple[str, int], ...] = (("long", 23000), ("short", 500))  # (name, prompt tokens)
    rounds: int = 20
    warmup: int = 2  # unmeasured rounds first (connections, the routers' first requests)
    fill: int = 0  # unmeasured long prompts through each router first: the state a busy fleet's has
    max_tokens: int = 4
    endpoint: str = "completions"  # completions | chat
    time_scale: float = 0.05
    prefill: int = 1
    decode: int = 1
    direct: bool = True
    seed: int = 1


def prompt_text(tokens: int, seed: int) -> str:
    """Seeded random lowercase words, exactly the characters the simulator counts as `tokens` tokens."""
    rng = random.Random(seed)
    return "".join(rng.choices(_ALPHABET, k=round(DEFAULT_CHARS_PER_TOKEN * tokens)))


def request_body(cfg: PolicyConfig, prompt: str, extra: dict | None = None, stream: bool = True) -> dict:
    """A /v1/completions or /v1/chat/completions body for `prompt` (exactly max_tokens out)."""
    body: dict = {"model": SIM_MODEL, "max_tokens": cfg.max_tokens, "ignore_eos": True, "stream": stream}
    if cfg.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body | (extra or {})


def path_of(cfg: PolicyConfig) -> str:
    """The request path of the configured endpoint."""
    return "/v1/chat/completions" if cfg.endpoint == "chat" else "/v1/completions"


def _host_port(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


async def stream_ttft(url: str, path: str, body: dict, t0: float | None = None) -> float:
    """Seconds from t0 (default: now) to the first streamed event of one request; NaN if it failed."""
    host, port = _host_port(url)
    client = StreamClient(host, port, keepalive=False, parse=False)
    rec = Record()
    start = time.perf_counter() if t0 is None else t0
    await client.run(request_bytes(host, port, path, body, keepalive=False), rec)
    client.close()
    if rec.error or not rec.chunks:
        return NAN
    return rec.chunks[0] - start


async def post_json(url: str, path: str, body: dict) -> dict:
    """One non-streaming POST over a fresh connection; the JSON reply (ValueError unless 200)."""
    host, port = _host_port(url)
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(request_bytes(host, port, path, body, keepalive=False))
    raw = await reader.read()  # Connection: close: the reply ends with the connection
    writer.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        status = head.split(b"\r\n", 1)[0].decode(errors="replace")
        raise ValueError(f"{url}{path}: {status}")
    return json.loads(payload)


async def direct_ttft(prefill_url: str, decode_url: str, cfg: PolicyConfig, prompt: str) -> float:
    """The P/D protocol without a router (what vllm-router does per request): TTFT of the decode stream."""
    t0 = time.perf_counter()
    ask = {"kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False}, "max_tokens": 1}
    try:
        reply = await post_json(prefill_url, path_of(cfg), request_body(cfg, prompt, ask, stream=False))
    except (OSError, ValueError):
        return NAN
    params = {"kv_transfer_params": reply.get("kv_transfer_params")}
    return await stream_ttft(decode_url, path_of(cfg), request_body(cfg, prompt, params), t0)


@dataclass
class Target:
    """One way to the pool: a router with a policy (its pid, for CPU), or `direct`."""

    name: str
    url: str | None = None
    pid: int | None = None
    ttft: dict[str, list[float]] = field(default_factory=dict)  # class -> per round (NaN: failed)
    cpu: dict[str, float] = field(default_factory=dict)  # class -> router CPU seconds over the rounds


async def measure(
    target: Target, cfg: PolicyConfig, pool: tuple[str, str], prompt: str
) -> tuple[float, float]:
    """One request through `target`: (TTFT s, router CPU s it took)."""
    before = cpu_seconds([target.pid]) if target.pid else 0.0
    if target.url is None:
        ttft = await direct_ttft(pool[0], pool[1], cfg, prompt)
    else:
        ttft = await stream_ttft(target.url, path_of(cfg), request_body(cfg, prompt))
    after = cpu_seconds([target.pid]) if target.pid else 0.0
    return ttft, after - before


async def fill_routers(targets: Sequence[Target], cfg: PolicyConfig, batch: int = 4) -> None:
    """cfg.fill distinct long prompts through every router, `batch` at a time (prefix trees grow as in
    a fleet that has served traffic; cache_aware keeps each prompt's text until eviction)."""
    tokens = cfg.classes[0][1]
    for target in targets:
        if target.url is None or not cfg.fill:
            continue
        for start in range(0, cfg.fill, batch):
            seeds = range(-1 - start, -1 - min(cfg.fill, start + batch), -1)  # never a measured prompt's
            bodies = [request_body(cfg, prompt_text(tokens, seed)) for seed in seeds]
            await asyncio.gather(*(stream_ttft(target.url, path_of(cfg), b) for b in bodies))
        print(f"filled {target.name} with {cfg.fill} long prompts", flush=True)


async def run_rounds(targets: Sequence[Target], cfg: PolicyConfig, pool: tuple[str, str]) -> None:
    """Fill, warm-up, then the measured rounds: per class every target once, order rotated each round."""
    await fill_routers(targets, cfg)
    for r in range(-cfg.warmup, cfg.rounds):
        for ci, (cls, tokens) in enumerate(cfg.classes):
            k = r % len(targets)
            for ti, target in enumerate([*targets[k:], *targets[:k]]):
                seed = cfg.seed * 1_000_003 + (r + cfg.warmup) * 10_007 + ci * 101 + ti
                ttft, cpu = await measure(target, cfg, pool, prompt_text(tokens, seed))
                if r >= 0:
                    target.ttft.setdefault(cls, []).append(ttft)
                    target.cpu[cls] = target.cpu.get(cls, 0.0) + cpu
        if r >= 0:
            print(f"round {r + 1}/{cfg.rounds} done", flush=True)


def paired_added(target: Sequence[float], base: Sequence[float]) -> list[float]:
    """Per-round TTFT differences target - base, rounds where either failed left out, sorted."""
    return sorted(t - b for t, b in zip(target, base, strict=True) if t == t and b == b)


def summary(targets: Sequence[Target], cfg: PolicyConfig) -> list[dict]:
    """One row per (class, target): samples, TTFT p50, added TTFT vs round_robin p50/p90, router CPU."""
    base = next(t for t in targets if t.name == BASELINE)
    rows = []
    for cls, tokens in cfg.classes:
        for t in targets:
            ok = sorted(x for x in t.ttft[cls] if x == x)
            added = paired_added(t.ttft[cls], base.ttft[cls])
            half = cfg.rounds // 2  # a policy whose cost grows with its state shows it here
            first = paired_added(t.ttft[cls][:half], base.ttft[cls][:half])
            second = paired_added(t.ttft[cls][half:], base.ttft[cls][half:])
            rows.append(
                {
                    "class": cls,
                    "tokens": tokens,
                    "target": t.name,
                    "samples": len(ok),
                    "failed": len(t.ttft[cls]) - len(ok),
                    "ttft_p50_ms": pct_ms(ok, 0.5),
                    "added_p50_ms": pct_ms(added, 0.5),
                    "added_p90_ms": pct_ms(added, 0.9),
                    "added_p50_first_half_ms": pct_ms(first, 0.5),
                    "added_p50_second_half_ms": pct_ms(second, 0.5),
                    "router_cpu_ms": 1000 * t.cpu[cls] / len(t.ttft[cls]) if t.pid else NAN,
                }
            )
    return rows


def policy_flags(spec: str) -> list[str]:
    """vllm-router's flags for NAME (both pools: --policy) or PREFILL/DECODE (one flag per pool)."""
    return policy_of(spec).argv()


def policy_of(spec: str) -> RouterPolicy:
    """NAME (both pools) or PREFILL/DECODE as the profile's RouterPolicy."""
    prefill, _, decode = spec.partition("/")
    return RouterPolicy(prefill=prefill, decode=decode or prefill)


def start_pool(stack: ExitStack, cfg: PolicyConfig) -> tuple[list[str], list[str]]:
    """cfg.prefill producers and cfg.decode consumers (NixlConnector) on loopback: their URLs."""
    common = [SIM_MODEL, "--sim-time-scale", str(cfg.time_scale), "--disable-log-stats"]
    prefill = []
    for _ in range(cfg.prefill):
        env = {"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())}
        sim = SimProcess([*common, "--kv-transfer-config", KV_CONFIG % "kv_producer"], env=env)
        prefill.append(stack.enter_context(sim).url)
    decode = []
    for _ in range(cfg.decode):
        args = [*common, "--sim-link", "roce-400g", "--kv-transfer-config", KV_CONFIG % "kv_consumer"]
        sim = SimProcess(args)
        decode.append(stack.enter_context(sim).url)
    return prefill, decode


def run_benchmark(cfg: PolicyConfig) -> list[dict]:
    """Start the pool and one router per policy, run the rounds, return the summary rows."""
    if BASELINE not in cfg.policies:
        raise ValueError(f"the policies must include the baseline {BASELINE}")
    with ExitStack() as stack:
        prefill, decode = start_pool(stack, cfg)
        targets = []
        for name in cfg.policies:
            router = stack.enter_context(RouterProcess(prefill, decode, policy=policy_of(name)))
            assert router.proc is not None
            targets.append(Target(name, router.url, router.proc.pid))
        if cfg.direct:
            targets.append(Target(DIRECT))
        asyncio.run(run_rounds(targets, cfg, (prefill[0], decode[0])))
    return summary(targets, cfg)


def _ms(x: float) -> str:
    return "n/a" if x != x else f"{x:+.1f}" if abs(x) < 1e4 else f"{x:.0f}"


def report_lines(rows: Sequence[dict], cfg: PolicyConfig) -> list[str]:
    """The Markdown report: one table per prompt class, and the cheapest policy on long prompts."""
    filled = f" and {cfg.fill} long prompts through each router" if cfg.fill else ""
    out = [
        f"vllm-router P/D policies over {cfg.prefill} prefill + {cfg.decode} decode simulator(s) "
        f"(time scale {cfg.time_scale}, /{path_of(cfg).lstrip('/')}, {cfg.max_tokens} output tokens); "
        f"{cfg.rounds} interleaved rounds after {cfg.warmup} warm-up"
        f"{filled}, one request at a time; added = "
        f"TTFT minus {BASELINE}'s in the same round (paired), wall ms.",
    ]
    header = [
        "target",
        "samples",
        "failed",
        "TTFT p50",
        f"added p50 vs {BASELINE}",
        "added p90",
        "added p50 1st/2nd half",
        "router CPU ms/req",
    ]
    for cls, tokens in cfg.classes:
        out += ["", f"{cls} prompts ({tokens} tokens):", ""]
        table = [
            [
                r["target"],
                r["samples"],
                r["failed"],
                f"{r['ttft_p50_ms']:.1f}",
                _ms(r["added_p50_ms"]),
                _ms(r["added_p90_ms"]),
                f"{_ms(r['added_p50_first_half_ms'])} / {_ms(r['added_p50_second_half_ms'])}",
                "n/a" if r["router_cpu_ms"] != r["router_cpu_ms"] else f"{r['router_cpu_ms']:.1f}",
            ]
            for r in rows
            if r["class"] == cls
        ]
        out += markdown_table(header, table)
    long_cls = cfg.classes[0][0]
    routers = sorted(
        (r for r in rows if r["class"] == long_cls and r["target"] != DIRECT),
        key=lambda r: (r["router_cpu_ms"], r["added_p50_ms"]),
    )
    ranking = ", ".join(f"{r['target']} {r['router_cpu_ms']:.1f}" for r in routers)
    out += ["", f"router CPU ms per {long_cls} request, cheapest first: {ranking}"]
    return out

"""Colocated against disaggregated: the same seeded workload through the gateway to each pool in turn.

`BenchPlan` says what to send (workload, seed, rate or concurrency, how much) and `PoolTarget` what each
pool is (its GPU count, where its metrics are). `run_compare` warms each pool up, runs it, reads the
server side over its run window, and keeps going when a pool is down (its error is kept, naming it).
`sweep` finds each pool's largest rate meeting the SLO attainment target (the search: `sla_search`).

`colocated_choices` (issue 26): the colocated pool runs once per balancing choice, back to back, each
run's requests asking the gateway for that choice in its choice header (a request without it routes by
the gateway's own setting). Every choice run gets the same lengths and arrivals, its prompts salted
(their first word replaced by one of the run's own: `salted`) so that no run finds the prompts of an
earlier one in the simulators' prefix caches. The first choice's run is the colocated pool's result
(headline, verdict); every run is in `BenchResult.choices`.

`routed` (issue 34) is a run like a pool's that sends no pool header: the gateway's own routing decides,
each record keeping the pool and reason the gateway answered with (bench.routes reads them); its prompts
salted too, so it finds nothing an earlier pool run left in the prefix caches.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from pdfleet.bench.arrivals import gamma_starts
from pdfleet.bench.load import Gateway, PoolDown, PoolRun, Progress, Schedule, run_pool, warm_up
from pdfleet.bench.server_side import chain, kv_peak, reasons
from pdfleet.bench.sla_search import margin, next_rate
from pdfleet.bench.stats import Bounds, summarize
from pdfleet.bench.workloads import Item, WorkloadSpec, build, check_spec
from pdfleet.errors import ValidationError
from pdfleet.gateway.policy import POOLS  # the gateway's pools, the ones a bench can ask for
from pdfleet.metrics.source import MetricsError, MetricsSource
from pdfleet.model.routing import COLOCATED_CHOICES

# the bench's own run through the gateway's routing: no pool header, the live stage decides (issue 34)
ROUTED = "routed"
BENCH_POOLS: tuple[str, ...] = (*POOLS, ROUTED)
ROUTED_SALT = 99  # its prompts' own first characters (`salted`): the pools' runs share its instances


@dataclass(frozen=True)
class BenchPlan:
    """What one bench sends; rates and durations are in the profile's (simulated) seconds."""

    workload: WorkloadSpec
    seed: int = 0
    rate: float | None = None  # requests/s (open loop), None with concurrency
    burstiness: float = 1.0
    concurrency: int | None = None
    duration_s: float | None = None
    num_prompts: int | None = None
    pools: tuple[str, ...] = POOLS
    warmup: int = 4
    time_scale: float = 1.0  # the simulator's: wall seconds per simulated second
    long_prompt_tokens: int = 8192
    bounds: Bounds = Bounds(3000.0, 60.0)
    attainment_pct: float = 90.0
    sweep: bool = False
    colocated_choices: tuple[str, ...] = ()  # the colocated pool once per choice (empty: the gateway's own)

    def request_count(self) -> int:
        """How many requests the workload holds (concurrency + duration: enough to cycle through)."""
        if self.num_prompts is not None:
            return self.num_prompts
        if self.rate is not None and self.duration_s is not None:
            return max(1, round(self.rate * self.duration_s))
        return max(100, 20 * (self.concurrency or 1))

    def schedule(self, items: Sequence[Item]) -> Schedule:
        """Wall-clock starts (trace times, or gamma arrivals at `rate`) or a fixed concurrency."""
        s = self.time_scale
        if self.workload.name == "trace" and self.rate is None and self.concurrency is None:
            return Schedule(starts=[(it.at or 0.0) * s for it in items])
        if self.rate is not None:
            starts = gamma_starts(len(items), self.rate, self.burstiness, self.seed)
            return Schedule(starts=[t * s for t in starts], concurrency=self.concurrency)
        duration = None if self.num_prompts is not None else (self.duration_s or 60.0) * s
        return Schedule(concurrency=self.concurrency or 1, duration_s=duration)


# bounds a run can have: past them a float overflowed (a timestamp, a sleep) or the requests built
# before a run starts filled the memory (issue 27 N11)
MAX_RATE = 100_000.0
MAX_DURATION_S = 7 * 24 * 3600.0
MAX_PROMPTS = 1_000_000
MAX_BURSTINESS = 1000.0


def check_plan(plan: BenchPlan) -> None:
    """Options that contradict each other or make no run (a ValidationError names the option)."""
    if plan.rate is not None and plan.concurrency is not None:
        raise ValidationError("give --rate R or --concurrency C, not both")
    if plan.rate is not None and not 0 < plan.rate <= MAX_RATE:
        raise ValidationError(f"--rate {plan.rate}: must be > 0 and at most {MAX_RATE:g} requests/s")
    if plan.concurrency is not None and plan.concurrency < 1:
        raise ValidationError(f"--concurrency {plan.concurrency}: must be at least 1")
    if plan.duration_s is not None and plan.num_prompts is not None:
        raise ValidationError("give --duration S or --num-prompts N, not both")
    if plan.duration_s is not None and not 0 < plan.duration_s <= MAX_DURATION_S:
        raise ValidationError(f"--duration {plan.duration_s}: must be > 0 and at most {MAX_DURATION_S:g} s")
    if plan.num_prompts is not None and not 1 <= plan.num_prompts <= MAX_PROMPTS:
        raise ValidationError(
            f"--num-prompts {plan.num_prompts}: must be at least 1 and at most {MAX_PROMPTS} "
            "(each pool's requests are built before its run starts)"
        )
    if not 0 < plan.burstiness <= MAX_BURSTINESS:
        raise ValidationError(
            f"--burstiness {plan.burstiness}: must be > 0 and at most {MAX_BURSTINESS:g} (1 = Poisson)"
        )
    if plan.rate is not None and plan.duration_s is not None and plan.rate * plan.duration_s > MAX_PROMPTS:
        raise ValidationError(
            f"--rate {plan.rate:g} x --duration {plan.duration_s:g} is more than {MAX_PROMPTS} requests "
            "a pool (each pool's requests are built before its run starts)"
        )
    unknown = [p for p in plan.pools if p not in BENCH_POOLS]
    if unknown or not plan.pools:
        raise ValidationError(f"--pools {','.join(plan.pools)}: pools are {', '.join(BENCH_POOLS)}")
    check_choices(plan)
    check_spec(plan.workload)


def check_choices(plan: BenchPlan) -> None:
    """--colocated-choice: known choices, each once, with the colocated pool run and no sweep."""
    choices = plan.colocated_choices
    if not choices:
        return
    given = ",".join(choices)
    unknown = [c for c in choices if c not in COLOCATED_CHOICES]
    if unknown:
        raise ValidationError(
            f"--colocated-choice {given}: {', '.join(unknown)} is not a colocated choice; "
            f"choices are {', '.join(COLOCATED_CHOICES)}"
        )
    twice = sorted({c for c in choices if choices.count(c) > 1})
    if twice:
        raise ValidationError(f"--colocated-choice {given}: {', '.join(twice)} given twice")
    if "colocated" not in plan.pools:
        raise ValidationError(
            f"--colocated-choice {given}: the colocated pool is not run (--pools {','.join(plan.pools)})"
        )
    if plan.sweep:
        raise ValidationError(f"--colocated-choice {given}: give it or --sweep, not both")


def salted(items: Sequence[Item], run: int) -> list[Item]:
    """The items with each prompt's first three characters (a word of the workload's) replaced by the
    run's own (`r00`, `r01`, ...): the same length and estimate, and no prefix shared with another run's
    (within a run, prompts that shared a prefix still share it)."""
    salt = f"r{run:02d}"
    return [
        dataclasses.replace(it, prompt=salt + it.prompt[3:]) if len(it.prompt) > 3 else it for it in items
    ]


@dataclass(frozen=True)
class PoolTarget:
    """One pool as the bench sees it: its GPUs, and the metrics source for its server side (None: none)."""

    name: str
    gpus: int
    metrics: MetricsSource | None = None
    kv_metrics: MetricsSource | None = None  # sampled during the run (a source of its own for direct scrapes)
    instances: int = 0  # instances the gateway picks among in this pool (0: one per GPU)
    # the KV-transfer histogram of the model's connector on its pinned release (facts table; None: none)
    kv_histogram: str | None = None

    @property
    def instance_count(self) -> int:
        """The instances requests are spread over (colocated: the gateway's round robin)."""
        return self.instances or self.gpus


@dataclass
class PoolResult:
    """One pool's outcome: its run and server figures, or the error that kept it from running."""

    target: PoolTarget
    run: PoolRun | None = None
    server: dict[str, dict[str, float | str]] = field(default_factory=dict)
    kv_peak: dict[str, float | str] = field(default_factory=dict)  # per role, or {"error": why}
    reasons: dict[str, float] | str = field(default_factory=dict)  # decider reason: requests, or why none
    error: str | None = None
    sweep: list[dict[str, float]] = field(default_factory=list)  # --sweep: per rate, the figures that gate


@dataclass
class BenchResult:
    """Every pool's result, the items sent, and whether the run was cut short."""

    plan: BenchPlan
    items: list[Item]
    pools: dict[str, PoolResult]
    partial: bool = False
    choices: dict[str, PoolResult] = field(default_factory=dict)  # colocated, per choice run, in order
    routing: dict[str, Any] = field(default_factory=dict)  # a routed run: the gateway's stage, threshold


def _scrape_start(source: MetricsSource | None) -> None:
    """A direct scrape needs a baseline at the window's start; Prometheus keeps its own history."""
    scrape = getattr(source, "scrape", None)
    if callable(scrape):
        with contextlib.suppress(MetricsError):  # the figures will then say the source is unavailable
            scrape()


async def run_one(
    plan: BenchPlan,
    gw: Gateway,
    target: PoolTarget,
    items: Sequence[Item],
    schedule: Schedule,
    stop: asyncio.Event,
    progress: Progress | None,
    choice: str | None = None,
) -> PoolResult:
    """Warm up, run and read one pool (its requests asking for `choice`, when given); a pool that is
    down becomes a result with its error."""
    result = PoolResult(target)
    client = gw.client()
    forced = target.name != ROUTED
    try:
        await warm_up(client, gw, target.name, items, plan.warmup, forced)
    except PoolDown as err:
        result.error = str(err)
        return result
    finally:
        client.close()
    _scrape_start(target.metrics)
    kv_source = target.kv_metrics or target.metrics
    # the KV-usage sampler run beside the pool's load
    background = partial(kv_peak, kv_source, target.name) if kv_source is not None else None
    run = await run_pool(
        gw, target.name, items, schedule, plan.long_prompt_tokens, stop, progress, background, choice, forced
    )
    result.run, result.kv_peak = run, run.samples
    if target.metrics is not None:
        window = max(1.0, run.wall_s)
        result.server = await asyncio.to_thread(
            chain, target.metrics, target.name, window, target.kv_histogram
        )
        result.reasons = await asyncio.to_thread(reasons, target.metrics, window)
    return result


async def run_compare(
    plan: BenchPlan,
    gw: Gateway,
    targets: dict[str, PoolTarget],
    stop: asyncio.Event,
    progress: Callable[[str], Progress | None] | None = None,
) -> BenchResult:
    """Each pool of the plan in turn, the same items and schedule; stops early (partial) on `stop`."""
    check_plan(plan)
    items = build(plan.workload, plan.request_count(), plan.seed)
    schedule = plan.schedule(items)
    out = BenchResult(plan, items, {})
    for name in plan.pools:
        if stop.is_set():
            break
        if name == "colocated" and plan.colocated_choices:
            await _run_choices(plan, gw, targets[name], items, schedule, stop, progress, out)
            continue
        mine = salted(items, ROUTED_SALT) if name == ROUTED else items  # no prefix cached by another run
        res = await run_one(
            plan, gw, targets[name], mine, schedule, stop, progress(name) if progress else None
        )
        if plan.sweep and res.run is not None and not stop.is_set():
            res.sweep = await sweep(plan, gw, targets[name], stop, None)
        out.pools[name] = res
    out.partial = stop.is_set()
    return out


async def _run_choices(
    plan: BenchPlan,
    gw: Gateway,
    target: PoolTarget,
    items: Sequence[Item],
    schedule: Schedule,
    stop: asyncio.Event,
    progress: Callable[[str], Progress | None] | None,
    out: BenchResult,
) -> None:
    """The colocated pool once per choice, salted items, the same schedule; the first is the pool's."""
    for k, choice in enumerate(plan.colocated_choices):
        if stop.is_set():
            break
        bar = progress(f"colocated {choice}") if progress else None
        res = await run_one(plan, gw, target, salted(items, k), schedule, stop, bar, choice)
        out.choices[choice] = res
        out.pools.setdefault("colocated", res)


def attainment(run: PoolRun, plan: BenchPlan) -> float:
    """SLO attainment (%) of a run: good requests over all, failed ones counted as bad."""
    return float(summarize(run.records, run.wall_s, plan.bounds, plan.time_scale)["slo_attainment_pct"])


async def sweep(
    plan: BenchPlan,
    gw: Gateway,
    target: PoolTarget,
    stop: asyncio.Event,
    progress: Progress | None = None,
    steps: int = 6,
) -> list[dict[str, float]]:
    """The largest rate meeting the attainment target, searched as `vllm bench sweep serve_sla` does
    (`sla_search.next_rate`: double until a rate misses, then interpolate the margin's zero), at most
    `steps` runs from `plan.rate`.

    Returns one row per rate tried: rate, rate_per_gpu, attainment, its margin, ttft/tpot P95, whether it met.
    """
    rows: list[dict[str, float]] = []
    history: dict[float, float] = {}
    start = plan.rate or 1.0
    rate = next_rate(history, start)
    while rate is not None and len(rows) < steps and not stop.is_set():
        p = dataclasses.replace(plan, rate=rate, concurrency=None, sweep=False, warmup=0)
        items = build(p.workload, p.request_count(), p.seed)
        res = await run_one(p, gw, target, items, p.schedule(items), stop, progress)
        if res.run is None:
            rows.append({"rate": rate, "error": 1.0})
            break
        s = summarize(res.run.records, res.run.wall_s, p.bounds, p.time_scale)
        history[rate] = m = margin(float(s["slo_attainment_pct"]), plan.attainment_pct)
        rows.append(
            {
                "rate": rate,
                "rate_per_gpu": rate / max(1, target.gpus),
                "slo_attainment_pct": float(s["slo_attainment_pct"]),
                "margin_pct_points": m,
                "p95_ttft_ms": float(s["p95_ttft_ms"]),
                "p95_tpot_ms": float(s["p95_tpot_ms"]),
                "met": 1.0 if m <= 0 else 0.0,
            }
        )
        rate = next_rate(history, start)
    return rows


def best_rate(rows: Sequence[dict[str, float]]) -> float | None:
    """The largest rate of a sweep that met the target (None: none did)."""
    met = [r["rate"] for r in rows if r.get("met")]
    return max(met) if met else None

"""`invoke bench`: colocated against disaggregated on one seeded workload, through the gateway, with a report.

Thin wiring: options -> BenchPlan, the deployment's topology -> gateway, pools and metrics source, then
pdfleet.bench.compare runs each pool and pdfleet.bench.report writes the files. A rich progress
bar per pool; Ctrl-C stops cleanly and the report is written, marked partial.
"""

from __future__ import annotations

import asyncio
import math
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from invoke import Context, task
from invoke.exceptions import Exit

from pdfleet.bench.workloads import WORKLOADS, WorkloadSpec
from pdfleet.cli.exits import user_errors
from pdfleet.cli.options import HELP as COMMON_HELP
from pdfleet.cli.options import open_deployment
from pdfleet.cli.settings import Settings, repo_path
from pdfleet.errors import ValidationError

if TYPE_CHECKING:  # imported when a task runs (pdfleet/cli/__init__.py)
    from rich.console import Console
    from rich.table import Table

    from pdfleet.bench.compare import BenchPlan, BenchResult
    from pdfleet.bench.verdict import Thresholds, Verdict
    from pdfleet.fleet.deployment import Deployment

DEFAULT_RATE = 2.0
DEFAULT_DURATION_S = 60.0
# long-prompt-mix: a quarter of the requests are 16K-30K-token documents at 3 req/s, so each colocated
# instance has a long prefill about a third of the time with one or two short streams decoding beside it:
# at 0.1 and 2 req/s the gateway's round robin left ~1 short stream per instance, and the demo's 25 s
# held some 5 long prompts, too few same-instance overlaps to measure the guide's stall (issue 26)
MIX_RATE = 3.0
MIX_LONG_SHARE = WorkloadSpec().long_share

HELP = {
    "profile": COMMON_HELP["profile"],
    "inventory": COMMON_HELP["inventory"],
    "workload": f"Workload: {', '.join(WORKLOADS)} (default long-prompt-mix).",
    "rate": f"Open-loop arrivals per second, Poisson or gamma (default {DEFAULT_RATE:g}, long-prompt-mix "
    f"{MIX_RATE:g}; or --concurrency).",
    "concurrency": "Fixed concurrency: this many requests in flight, one after another (instead of --rate).",
    "duration": f"Seconds of load per pool (default {DEFAULT_DURATION_S:g}; or --num-prompts).",
    "num_prompts": "Requests per pool (instead of --duration).",
    "model": "The model whose pools to compare, by its name in the profile's models: (default: the first "
    "disaggregated one).",
    "pools": "Pools to run, comma-separated, in order (default: every pool the model has); `routed`: one "
    "run through the gateway's own routing (no pool header: its live stage and threshold decide), reported "
    "per length class and per route taken (pool and decider reason).",
    "stage": "--pools routed: run it at this stage of the gateway's policy (set through its admin API with "
    "the profile's admin key, the previous stage put back after the run).",
    "sweep": "Also find each pool's largest rate (per GPU) meeting slo.attainment_pct of requests.",
    "out": "Directory for results.json, requests.jsonl, report.md/html, plots (default: output_dir/bench-*).",
    "seed": "Seed of the workload and the arrivals (the same for every pool).",
    "burstiness": "Gamma shape of inter-arrivals: 1 = Poisson, < 1 burstier (as vllm bench serve's).",
    "dataset": "ShareGPT JSON (--workload sharegpt) or Mooncake trace JSONL (--workload trace).",
    "trace": "A Mooncake trace JSONL to replay, e.g. a gateway capture (--workload trace --dataset FILE).",
    "input_len": "random: prompt tokens; long-prompt-mix: the short turns' mean (default 1024 / 512).",
    "output_len": "Output tokens per request (default 128; long-prompt-mix short turns: mean, ±50%).",
    "range_ratio": "random: lengths uniform in [len*(1-r), len*(1+r)] (default 0).",
    "long_share": f"long-prompt-mix: share of 16K-30K-token document prompts (default {MIX_LONG_SHARE:g}).",
    "warmup": "Warm-up requests per pool before the measured run (default 4).",
    "colocated_choice": "Run the colocated pool once per balancing choice, comma-separated, e.g. "
    "round_robin,prefix_load (each run's requests ask the gateway for it; same lengths and arrivals); the "
    "report compares them. Default: one run, the gateway's own choice.",
}


def _number(value: str | None, kind: type, option: str) -> Any:
    """An option's value as int/float (invoke passes strings for optional values), else a clear error."""
    if value is None:
        return None
    try:
        number = kind(value)
    except (TypeError, ValueError):
        raise ValidationError(
            f"--{option} {value!r}: not a {'whole ' if kind is int else ''}number"
        ) from None
    if kind is float and not math.isfinite(number):
        raise ValidationError(f"--{option} {value!r}: not a finite number")
    return number


def plan_from_options(deployment: Deployment, opts: dict[str, Any]) -> BenchPlan:
    """The BenchPlan of the task's options and the benched model's SLOs, length threshold and the profile's
    time scale."""
    from pdfleet.bench.compare import BENCH_POOLS, ROUTED, BenchPlan, check_plan
    from pdfleet.bench.fleet_targets import bench_model, pools_of
    from pdfleet.bench.stats import Bounds
    from pdfleet.bench.workloads import WorkloadSpec

    spec = bench_model(deployment.profile, opts.get("model"))
    profile = deployment.profile.for_model(spec)
    slo = profile.slo
    defaults = WorkloadSpec()
    opts = {**opts, **_trace_option(opts)}
    workload = WorkloadSpec(
        name=opts["workload"],
        input_len=_number(opts["input_len"], int, "input-len")
        or (512 if opts["workload"] == "long-prompt-mix" else defaults.input_len),
        output_len=_number(opts["output_len"], int, "output-len") or defaults.output_len,
        range_ratio=_number(opts["range_ratio"], float, "range-ratio") or 0.0,
        long_share=_number(opts["long_share"], float, "long-share")
        if opts["long_share"] is not None
        else MIX_LONG_SHARE,
        dataset=str(repo_path(opts["dataset"])) if opts["dataset"] else None,
    )
    rate, conc = _number(opts["rate"], float, "rate"), _number(opts["concurrency"], int, "concurrency")
    duration, num = (
        _number(opts["duration"], float, "duration"),
        _number(opts["num_prompts"], int, "num-prompts"),
    )
    if rate is None and conc is None and opts["workload"] != "trace":
        rate = MIX_RATE if opts["workload"] == "long-prompt-mix" else DEFAULT_RATE
    if duration is None and num is None and opts["workload"] != "trace":
        duration = DEFAULT_DURATION_S
    have = pools_of(deployment.topology, spec.name)
    pools = tuple(p.strip() for p in opts["pools"].split(",") if p.strip()) if opts["pools"] else have
    if opts.get("stage") is not None and ROUTED not in pools:
        raise ValidationError(f"--stage {opts['stage']}: a stage is for the routed run (--pools routed)")
    unknown = [p for p in pools if p not in BENCH_POOLS]
    if unknown:
        raise ValidationError(
            f"--pools {opts['pools']}: {', '.join(unknown)} is not a pool; pools are {', '.join(BENCH_POOLS)}"
        )
    missing = [p for p in pools if p not in (*have, ROUTED) or (p == ROUTED and not have)]
    if missing:
        raise ValidationError(
            f"--pools: {_whose(deployment, spec.name)} no {', '.join(missing)} pool behind its gateway "
            f"(it has: {', '.join(have) or 'none'})"
        )
    scale = profile.vllm.sim.time_scale if profile.vllm.engine == "sim" else 1.0
    plan = BenchPlan(
        workload,
        seed=_number(opts["seed"], int, "seed") or 0,
        rate=rate,
        burstiness=_number(opts["burstiness"], float, "burstiness") or 1.0,
        concurrency=conc,
        duration_s=duration,
        num_prompts=num,
        pools=pools,
        warmup=_number(opts["warmup"], int, "warmup") if opts["warmup"] is not None else 4,
        time_scale=scale,
        long_prompt_tokens=profile.gateway.long_prompt_tokens,
        bounds=Bounds(slo.ttft_p99_ms, slo.tpot_p99_ms, slo.stall_ms),
        attainment_pct=slo.attainment_pct,
        sweep=bool(opts["sweep"]),
        colocated_choices=choices_option(opts.get("colocated_choice")),
    )
    check_plan(plan)  # before anything is contacted or written
    return plan


def choices_option(value: str | None) -> tuple[str, ...]:
    """`--colocated-choice A,B` as a tuple (checked with the plan: check_choices); an empty list refused."""
    if value is None:
        return ()
    choices = tuple(c.strip().lower() for c in value.split(",") if c.strip())
    if not choices:
        raise ValidationError(f"--colocated-choice {value!r}: name at least one choice")
    return choices


def _trace_option(opts: dict[str, Any]) -> dict[str, Any]:
    """`--trace FILE` as `--workload trace --dataset FILE` (the workload defaults to trace with it, and to
    long-prompt-mix without); another workload or a --dataset beside it is refused."""
    trace, workload = opts.get("trace"), opts.get("workload")
    if not trace:
        return {"workload": workload or "long-prompt-mix"}
    if workload not in (None, "trace"):
        raise ValidationError(
            f"--trace {trace}: replays a trace; it goes with --workload trace, not {workload}"
        )
    if opts.get("dataset"):
        raise ValidationError(f"--trace {trace}: give --trace FILE or --dataset FILE, not both")
    return {"workload": "trace", "dataset": trace}


def _whose(deployment: Deployment, model: str) -> str:
    """`profile P has` (one model, messages as ever) or `model M of profile P has`."""
    name = deployment.profile.name
    return (
        f"profile {name} has"
        if len(deployment.profile.served) == 1
        else f"model {model} of profile {name} has"
    )


def thresholds_of(deployment: Deployment, model: str | None = None) -> Thresholds:
    """The verdict's bounds from the benched model's slo."""
    from pdfleet.bench.fleet_targets import bench_model
    from pdfleet.bench.verdict import Thresholds

    slo = bench_model(deployment.profile, model).slo
    return Thresholds(slo.ttft_bound_ms, slo.tpot_bound_ms, slo.prefill_queue_p95_ms, slo.decode_queue_p95_ms)


def short_table(doc: dict[str, Any]) -> Table:
    """Short streams beside long prefills per pool (what the guide talks about) as a rich table."""
    from rich.table import Table

    from pdfleet.bench.report import SHORT, short_rows

    table = Table(title="short streams beside long prefills" + (" (PARTIAL)" if doc["partial"] else ""))
    for column in SHORT:
        table.add_column(column, justify="left" if column == "pool" else "right")
    for row in short_rows(doc):
        table.add_row(*row)
    return table


def choice_table(doc: dict[str, Any]) -> Table:
    """--colocated-choice: the colocated pool per balancing choice as a rich table."""
    from rich.table import Table

    from pdfleet.bench.balancing import CHOICES, choice_rows

    table = Table(title="colocated balancing" + (" (PARTIAL)" if doc["partial"] else ""))
    for column in CHOICES:
        table.add_column(column, justify="left" if column == "colocated choice" else "right")
    for row in choice_rows(doc):
        table.add_row(*row)
    return table


def headline_table(doc: dict[str, Any]) -> Table:
    """The headline (TTFT P95, ITL P99, stalls per 100 streams, per class, per pool) as a rich table."""
    from rich.table import Table

    from pdfleet.bench.report import HEADLINE, headline_rows

    table = Table(title="bench: colocated vs P/D" + (" (PARTIAL)" if doc["partial"] else ""))
    for column in HEADLINE:
        table.add_column(column, justify="left" if column in ("pool", "class") else "right")
    for row in headline_rows(doc):
        table.add_row(*row)
    return table


async def _run(
    plan: BenchPlan, deployment: Deployment, key: str, console: Console, model: str | None
) -> BenchResult:
    """Run every pool of the benched model with a progress bar; SIGINT sets the stop event instead of
    killing the run."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from pdfleet.bench.compare import run_compare
    from pdfleet.bench.fleet_targets import (
        bench_model,
        gateway_of,
        kv_histogram,
        metrics_sources,
        pool_targets,
    )

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, stop.set)
    topology = deployment.topology
    spec = bench_model(deployment.profile, model)
    sources, what = metrics_sources(topology, lambda m: console.print(m), spec.name)
    console.print(f"model {spec.name}, server side: {what}")
    targets = pool_targets(topology, plan.pools, sources, spec.name, kv_histogram(deployment.profile, spec))
    gw = gateway_of(deployment.profile, topology, key, spec.aliases[0])
    bars = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )

    def progress_for(pool: str) -> Callable[[int, int | None], None]:
        """A progress bar for one pool and its update callback."""
        task_id = bars.add_task(f"{pool} ({targets[pool.split()[0]].gpus} GPU)", total=None)

        def update(done: int, total: int | None) -> None:
            """Move the bar."""
            bars.update(task_id, completed=done, total=total)

        return update

    try:
        with bars:
            return await run_compare(plan, gw, targets, stop, progress_for)
    finally:
        loop.remove_signal_handler(signal.SIGINT)


def _event_loop_run(coro: Any) -> Any:
    """uvloop when installed (a third of asyncio's CPU per event: the client must not be the bottleneck)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - depends on the platform
        return asyncio.run(coro)
    return uvloop.run(coro)


def run_bench(
    ctx: Context, profile: str, inventory: str | None, opts: dict[str, Any], out: str | None, console: Console
) -> tuple[dict[str, Any], Verdict, Path]:
    """Load the deployment, run the bench, write every file; (results document, verdict, out dir)."""
    from pdfleet.bench.fleet_targets import bench_model, read_client_key
    from pdfleet.bench.report import write_all

    settings = Settings.of(ctx)
    deployment = open_deployment(ctx, profile, inventory)
    plan = plan_from_options(deployment, opts)
    spec = bench_model(deployment.profile, opts.get("model"))
    key = read_client_key(deployment.profile.gateway.client_key_file)
    out_dir = (
        repo_path(out)
        if out
        else settings.output_dir / f"bench-{deployment.profile.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    with _routing(deployment, plan, opts, console) as routing:
        result = _event_loop_run(_run(plan, deployment, key, console, spec.name))
    result.routing = routing
    doc, verdict = write_all(
        out_dir, result, spec.aliases[0], deployment.profile.name, thresholds_of(deployment, spec.name)
    )
    return doc, verdict, out_dir


def _routing(deployment: Deployment, plan: BenchPlan, opts: dict[str, Any], console: Console) -> Any:
    """A routed run's routing (its stage set for the run, when asked); nothing without one."""
    from contextlib import nullcontext

    from pdfleet.bench.compare import ROUTED
    from pdfleet.bench.fleet_targets import bench_model
    from pdfleet.cli.bench_routed import routed

    if ROUTED not in plan.pools:
        return nullcontext({})
    model = bench_model(deployment.profile, opts.get("model")).name  # its model group, with several
    return routed(deployment, opts.get("stage"), opts.get("stage_weights"), console.print, model)


def print_outcome(doc: dict[str, Any], verdict: Verdict, out_dir: Path, console: Console) -> list[str]:
    """Headline table and verdict on stdout; the pools that were down (their errors) are returned."""
    from rich.console import Console

    from pdfleet.bench.balancing import choice_notes
    from pdfleet.bench.report import interference_note, short_notes
    from pdfleet.cli.bench_routed import print_routes

    out = Console()
    if not out.is_terminal:  # a pipe or a file: no wrapping of the table's columns at 80 characters
        out = Console(width=160)
    out.print(short_table(doc))
    for line in [interference_note(doc), *short_notes(doc)]:
        if line:
            out.print(line, highlight=False)
    if doc.get("colocated_choices"):
        out.print(choice_table(doc))
        for line in choice_notes(doc):
            out.print(line, highlight=False)
    out.print(headline_table(doc))
    print_routes(doc, out)
    out.print(f"verdict: {verdict.headline}")
    for warning in verdict.warnings:
        out.print(f"[yellow]warning: {warning}[/]")
    console.print(f"written: {out_dir}/results.json, report.md, report.html, requests.jsonl")
    return [f"{p}: {s['error']}" for p, s in doc["pools"].items() if "error" in s]


@task(help=HELP, auto_shortflags=False, positional=[])  # 20 options: short flags would collide
@user_errors
def bench(
    ctx: Context,
    profile: str,
    inventory: str | None = None,
    workload: str | None = None,
    rate: str | None = None,
    concurrency: str | None = None,
    duration: str | None = None,
    num_prompts: str | None = None,
    model: str | None = None,
    pools: str | None = None,
    sweep: bool = False,
    out: str | None = None,
    seed: str | None = None,
    burstiness: str | None = None,
    dataset: str | None = None,
    trace: str | None = None,
    input_len: str | None = None,
    output_len: str | None = None,
    range_ratio: str | None = None,
    long_share: str | None = None,
    warmup: str | None = None,
    colocated_choice: str | None = None,
    stage: str | None = None,
) -> None:
    """Send the same seeded workload through the gateway to each pool; results, report and the verdict."""
    from rich.console import Console

    console = Console(stderr=True)
    opts = {
        "workload": workload,
        "rate": rate,
        "concurrency": concurrency,
        "duration": duration,
        "num_prompts": num_prompts,
        "model": model,
        "pools": pools,
        "sweep": sweep,
        "seed": seed,
        "burstiness": burstiness,
        "dataset": dataset,
        "trace": trace,
        "input_len": input_len,
        "output_len": output_len,
        "range_ratio": range_ratio,
        "long_share": long_share,
        "warmup": warmup,
        "colocated_choice": colocated_choice,
        "stage": stage,
    }
    doc, verdict, out_dir = run_bench(ctx, profile, inventory, opts, out, console)
    down = print_outcome(doc, verdict, out_dir, console)
    if doc["partial"]:
        console.print("[yellow]bench: interrupted; the report is partial[/]")
    if down:
        for line in down:
            print(f"error: {line}", file=sys.stderr)
        raise Exit(code=1)

"""`invoke plan`: which layout of N GPUs (colocated, P/D, both; TP; budgets; threshold) serves this traffic
best, predicted with the engine model and the discrete-event driver in seconds, before buying or moving
anything.

Thin wiring: the deployment gives the GPU kind, model, link, SLOs and today's pools; bench's own option
parsing gives the workload, rate, duration and seed (the very requests `invoke bench` would send);
pdfleet.plan searches, predicts, decides and writes the report.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from invoke import Context, task

from pdfleet.bench.workloads import WORKLOADS
from pdfleet.cli.bench import plan_from_options
from pdfleet.cli.exits import user_errors
from pdfleet.cli.options import HELP as COMMON_HELP
from pdfleet.cli.options import open_deployment
from pdfleet.cli.plan_fleet import current_of, hardware_of, targets_of
from pdfleet.cli.settings import Settings, inventory_name, repo_path
from pdfleet.errors import ValidationError

if TYPE_CHECKING:  # imported when a task runs (pdfleet/cli/__init__.py)
    from rich.console import Console

    from pdfleet.bench.compare import BenchPlan
    from pdfleet.fleet.deployment import Deployment
    from pdfleet.model.profile import SloSpec
    from pdfleet.plan.decide import Decision
    from pdfleet.plan.predict import Request
    from pdfleet.plan.space import Load

DEFAULT_DURATION_S = 600.0  # ten minutes of traffic per layout (the speed target)
MAX_GPUS = 64

HELP = {
    "profile": COMMON_HELP["profile"],
    "inventory": COMMON_HELP["inventory"] + " Gives today's pools for the diff and the GPUs per host.",
    "gpus": f"GPUs of the profile's kind (vllm.sim.gpu) to lay out, 2-{MAX_GPUS}.",
    "workload": f"Workload: {', '.join(WORKLOADS)} (default long-prompt-mix), as `invoke bench` builds it.",
    "trace": "A Mooncake trace JSONL (timestamp ms, input_length, output_length, hash_ids): its requests "
    "at their own times (instead of a workload).",
    "rate": "Arrivals per second (default: invoke bench's for the workload).",
    "duration": f"Seconds of traffic simulated per layout (default {DEFAULT_DURATION_S:g}).",
    "seed": "Seed of the workload and the arrivals (the same as invoke bench's --seed).",
    "input_len": "random: prompt tokens; long-prompt-mix: the short turns' mean (as invoke bench).",
    "output_len": "Output tokens per request (as invoke bench).",
    "long_share": "long-prompt-mix: share of 16K-30K-token documents (as invoke bench).",
    "slo": "Override the profile's slo keys, e.g. ttft_p95_ms=2000,tpot_p95_ms=40 (the keys of a "
    "profile's slo:).",
    "gpus_per_host": "Largest TP to try (TP stays inside a host; default: the most GPUs an inventory "
    "host lists, 8 when none lists any).",
    "model": "The model to plan for, by its name in the profile's models: (default: as invoke bench).",
    "workers": "Processes simulating layouts at once (default: the cores this process may use).",
    "out": "Directory for plan.json, report.md/html, pareto.png (default: output_dir/plan-*).",
    "validate": "Then run the best two layouts the fleet serves as it stands through the real bench (one of "
    "its pools; or, for a hybrid, its whole layout through the gateway's own routing at a stage sending "
    "long prompts to P/D, put back after) with the same workload, rate and seed (under the lab's lock in "
    "the lab), and print predicted against measured per class, the ranking on both, and where the ITL "
    "comes from. Moves no host: other layouts are skipped with what would make them measurable. Bench "
    "files in OUT/validate/. Not with --trace.",
    "validate_duration": "--validate: seconds of traffic per measured pool (default 45, 5-600).",
    "measure_path": "First measure the request's path on the fleet (client, TLS, gateway, router): 40 "
    "minimal requests a route through the gateway, each one's client TTFT minus the instances' own mean from "
    "their /metrics; the prediction adds it to each first token (default: the profile's "
    "plan.request_path, else not modelled); always done before a validation. Raw figures in OUT/path.json.",
}


def _slo(base: SloSpec, text: str | None) -> SloSpec:
    """The profile's slo with --slo's KEY=MS overrides, validated as a profile's slo is."""
    from pdfleet.model.profile import SloSpec

    if not text:
        return base
    updates: dict[str, Any] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, sep, value = part.partition("=")
        if not sep or key.strip() not in SloSpec.model_fields:
            raise ValidationError(
                f"--slo {part!r}: expected KEY=VALUE with KEY one of {', '.join(SloSpec.model_fields)}"
            )
        updates[key.strip()] = value.strip()
    try:
        return SloSpec.model_validate({**base.model_dump(), **updates})
    except ValueError as err:
        raise ValidationError(f"--slo {text}: {err}") from None


def _tps(deployment: Deployment, given: str | None) -> tuple[int, ...]:
    """TP sizes to try: up to --gpus-per-host, else the most GPUs an inventory host lists (8 if none)."""
    from pdfleet.plan.space import TP_SIZES

    if given is not None:
        most = _int(given, "gpus-per-host", 1, 64)
    else:
        listed = [len(h.gpus) for h in deployment.inventory.hosts.values() if h.gpus]
        most = max(listed, default=8)
    return tuple(t for t in TP_SIZES if t <= most)


def _int(value: str, option: str, lo: int, hi: int) -> int:
    try:
        n = int(value)
    except ValueError:
        raise ValidationError(f"--{option} {value!r}: not a whole number") from None
    if not lo <= n <= hi:
        raise ValidationError(f"--{option} {n}: must be between {lo} and {hi}")
    return n


def _bench_plan(deployment: Deployment, opts: dict[str, Any]) -> BenchPlan:
    """invoke bench's plan for these options (its checks and defaults), open loop only."""
    bench_opts = {
        "concurrency": None,
        "num_prompts": None,
        "pools": None,
        "sweep": False,
        "burstiness": None,
        "range_ratio": None,
        "warmup": "0",
        "dataset": None,
        **opts,
    }
    return plan_from_options(deployment, bench_opts)


def _traffic(deployment: Deployment, opts: dict[str, Any]) -> tuple[list[Request], dict[str, Any], list[str]]:
    """The requests (bench's for the workload options, or the --trace file's), what they are, warnings."""
    from pdfleet.bench.compare import MAX_DURATION_S
    from pdfleet.plan.traffic import prefix_warning, requests_of, requests_of_trace

    trace = opts["trace"]
    if trace is None:
        bench = _bench_plan(deployment, opts["bench"])
        warn = prefix_warning(bench.workload.name)
        about = {"name": bench.workload.name, "dataset": bench.workload.dataset, "seed": bench.seed}
        return requests_of(bench), about, [warn] if warn else []
    duration = opts["bench"]["duration"]
    window = float(duration) if duration is not None else None
    if window is not None and not 0 < window <= MAX_DURATION_S:
        raise ValidationError(f"--duration {duration}: must be > 0 and at most {MAX_DURATION_S:g} s")
    reqs, empty = requests_of_trace(repo_path(trace), window)
    warnings = []
    if empty:
        warnings.append(f"{empty} request(s) of the trace produced no output token and are left out")
    if all(r.effective_tokens == r.prompt_tokens for r in reqs):
        warnings.append(prefix_warning("trace") or "")
    return reqs, {"name": "trace", "dataset": str(trace), "seed": None}, warnings


def run_plan(
    ctx: Context, profile: str, opts: dict[str, Any], console: Console
) -> tuple[dict[str, Any], Decision, Load]:
    """Search, predict, decide; (the plan document, the decision, the traffic's averages)."""
    from pdfleet.bench.fleet_targets import bench_model
    from pdfleet.bench.stats import Bounds
    from pdfleet.cli.plan_path import path_of
    from pdfleet.plan.decide import choose
    from pdfleet.plan.diff import inventory_changes, profile_changes
    from pdfleet.plan.report import document
    from pdfleet.plan.run import default_workers, predict_all
    from pdfleet.plan.space import THRESHOLDS, candidates, search_space
    from pdfleet.plan.traffic import load_of
    from pdfleet.plan.validate import pool_layouts

    deployment = open_deployment(ctx, profile, opts["inventory"])
    gpus = _int(opts["gpus"], "gpus", 2, MAX_GPUS) if opts["gpus"] is not None else None
    if gpus is None:
        raise ValidationError("--gpus N is required: how many GPUs of the profile's kind to lay out")
    model = opts["model"]
    spec = bench_model(deployment.profile, model)
    slo = _slo(spec.slo, opts["slo"])
    measure = opts["measure_path"]
    live = open_deployment(ctx, profile, opts["inventory"], fleet_layout=True) if measure else deployment
    path, measured = path_of(live, model, measure, opts["out_dir"])
    for line in measured:
        console.print(line, highlight=False, soft_wrap=True)
    requests, workload, warnings = _traffic(deployment, opts)
    hw = hardware_of(deployment, model)
    targets = targets_of(slo)
    fleet = current_of(live, model)  # the fleet's own layouts are searched too, inside the lists or not
    own = list(pool_layouts(fleet.pools, fleet.threshold).values())
    load = load_of(requests, targets.tpot_p95_ms, sorted({*THRESHOLDS, fleet.threshold}))
    keep, cut = search_space(gpus, load, hw, _tps(deployment, opts["gpus_per_host"]), own)
    console.print(f"plan: {len(keep)} layouts to simulate, {len(cut)} cut; {len(requests)} requests each")
    grid = set(candidates(gpus, _tps(deployment, opts["gpus_per_host"])))
    for layout in (x for x in [*keep, *(c.layout for c in cut)] if x not in grid):
        console.print(
            f"plan: the fleet's own {layout.name} added (outside the search's lists)", highlight=False
        )
    workers = _int(opts["workers"], "workers", 1, 64) if opts["workers"] else default_workers()
    t0 = time.perf_counter()
    bounds = Bounds(slo.ttft_p99_ms, slo.tpot_p99_ms, slo.stall_ms)
    long_tokens = deployment.profile.for_model(spec).gateway.long_prompt_tokens
    preds = predict_all(keep, requests, hw, bounds, long_tokens, workers, path=path)
    wall = time.perf_counter() - t0
    longest = max((r.effective_tokens for r in requests), default=0)
    decision = choose(preds, targets, longest, min(THRESHOLDS))
    current = current_of(deployment, model)
    rec = decision.recommended.prediction.layout if decision.recommended else None
    simulated = max((r.at for r in requests), default=0.0)
    header = {
        "profile": deployment.profile.name,
        "model": spec.name,
        "inventory": inventory_name(opts["inventory"], Settings.of(ctx)),  # what --to-plan checks
        "gpus": gpus,
        "hardware": {"gpu": hw.gpu.name, "model": hw.model.name, "link": hw.link.name},
        "workload": workload,
        "rate": load.rate,
        "duration_s": simulated,
        "seed": workload["seed"],
        "requests": len(requests),
        "request_path": path.doc(),
        "targets": {k: v for k, v in targets.__dict__.items()},
        "timing": {
            "layouts": len(keep),
            "simulated_s": simulated,
            "wall_s": wall,
            "workers": workers,
            "ratio": simulated * len(keep) / max(wall * workers, 1e-9),
        },
    }
    changes = {
        "profile": profile_changes(current, rec) if rec else [],
        "inventory": inventory_changes(current, rec) if rec else [],
    }
    return document(header, decision, cut, changes, warnings), decision, load


@task(help=HELP, auto_shortflags=False, positional=[])
@user_errors
def plan(
    ctx: Context,
    profile: str,
    gpus: str | None = None,
    inventory: str | None = None,
    workload: str = "long-prompt-mix",
    trace: str | None = None,
    rate: str | None = None,
    duration: str | None = None,
    seed: str | None = None,
    input_len: str | None = None,
    output_len: str | None = None,
    long_share: str | None = None,
    slo: str | None = None,
    gpus_per_host: str | None = None,
    model: str | None = None,
    workers: str | None = None,
    out: str | None = None,
    validate: bool = False,
    validate_duration: str | None = None,
    measure_path: bool = False,
) -> None:
    """Predict every layout of N GPUs for this traffic; ranked table, recommendation, diff, report."""
    from rich.console import Console

    from pdfleet.cli.plan_validate import run_validate, validate_duration_of
    from pdfleet.plan.decide import Targets
    from pdfleet.plan.path import of_doc
    from pdfleet.plan.report import write

    console = Console(stderr=True)
    if trace is not None and workload != "long-prompt-mix":
        raise ValidationError("give --workload W or --trace FILE, not both")
    if validate and trace is not None:
        raise ValidationError("--validate benches a workload: it does not replay a --trace")
    if validate_duration is not None and not validate:
        raise ValidationError("--validate-duration is for --validate")
    bench_s = validate_duration_of(validate_duration)
    if trace is not None and not repo_path(trace).is_file():
        raise ValidationError(f"--trace {trace}: cannot read the file (not found)")
    bench_opts = {
        "workload": workload,
        "rate": rate,
        "duration": duration if duration is not None or trace else str(DEFAULT_DURATION_S),
        "trace": None,
        "seed": seed,
        "input_len": input_len,
        "output_len": output_len,
        "long_share": long_share,
        "model": model,
    }
    opts: dict[str, Any] = {
        "trace": trace,
        "inventory": inventory,
        "gpus": gpus,
        "model": model,
        "slo": slo,
        "gpus_per_host": gpus_per_host,
        "workers": workers,
        "bench": bench_opts,
        "measure_path": measure_path or validate,
    }
    settings = Settings.of(ctx)
    out_dir = (
        repo_path(out)
        if out
        else settings.output_dir / f"plan-{Path(profile).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    opts["out_dir"] = Path(out_dir)
    doc, decision, load = run_plan(ctx, profile, opts, console)
    files = write(Path(out_dir), doc)
    print_outcome(doc)
    console.print(f"written: {', '.join(str(f) for f in files)}")
    if validate:
        opts["validate_duration"] = bench_s
        targets = Targets(**doc["targets"])
        path = of_doc(doc["request_path"])
        for line in run_validate(
            ctx, profile, opts, decision, targets, Path(out_dir), console, load.long, path
        ):
            print(line, flush=True)


def print_outcome(doc: dict[str, Any]) -> None:
    """The top of the ranked table, the recommendation, why and the diff on stdout."""
    from rich.console import Console
    from rich.table import Table

    from pdfleet.plan.report import RANKED, path_text, ranked_rows

    out = Console() if Console().is_terminal else Console(width=200)
    table = Table(title=f"plan: {doc['gpus']} x {doc['hardware']['gpu']} ({doc['requests']} requests)")
    for column in RANKED:
        table.add_column(column)
    for row in ranked_rows(doc)[:10]:
        table.add_row(*row)
    out.print(table)
    out.print(f"recommended: {doc['recommended']}", highlight=False)
    out.print(f"  {path_text(doc['request_path'])}", highlight=False)
    for line in [*doc["why"], *doc["warnings"]]:
        out.print(f"  {line}", highlight=False)
    for line in doc["changes"]["profile"] + doc["changes"]["inventory"]:
        out.print(f"  change: {line}", highlight=False)

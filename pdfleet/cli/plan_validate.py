"""`invoke plan --validate`: the plan's best two layouts that the fleet serves as it stands, run through the
real bench (the plan's workload, rate and seed, `--validate-duration` seconds a run), and printed predicted
against measured side by side, with where the ITL comes from (the model's gaps, the instances' own, the
client's: the machine's delivery jitter is not the model's error).

A layout equal to one of the fleet's pools is benched on that pool; the hybrid equal to the fleet's whole
layout (pool counts, TP, budgets, the gateway's long_prompt_tokens) through the bench's routed run: the
gateway's own routing at a stage sending every long prompt to P/D and no short one (set for the run
through the gateway's admin API and put back after it), reported per class and per route taken. Nothing
is moved: any other layout is skipped with what would make it measurable, so the fleet is left as it was
found, also when the bench fails or is interrupted. The decision is pure (pdfleet.plan.validate,
pdfleet.plan.gaps); this wires the bench, the /metrics snapshots and the prediction on the very requests
the bench sent.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from invoke import Context

from pdfleet.errors import ValidationError
from pdfleet.model.stages import StageSpec
from pdfleet.plan.path import NOT_MODELLED, RequestPath

if TYPE_CHECKING:
    from rich.console import Console

    from pdfleet.fleet.deployment import Deployment
    from pdfleet.plan.decide import Decision, Targets
    from pdfleet.plan.predict import Prediction, Request
    from pdfleet.plan.space import Hardware, Layout
    from pdfleet.plan.validate import Shares

LONG_TO_PD = StageSpec(short=0, long=100)  # the stage a hybrid layout routes by: long prompts to P/D
RUNS = {"colocated": "colocated pool", "disagg": "disagg pool", "routed": "whole layout (routed run)"}
DEFAULT_VALIDATE_S = 45.0  # seconds of traffic per measured pool: the fidelity runs' length (docs/plan.md)
MAX_VALIDATE_S = 600.0
# invoke bench's options the plan does not take, as `invoke bench` defaults them (its warm-up included)
BENCH_DEFAULTS: dict[str, Any] = {
    "concurrency": None,
    "num_prompts": None,
    "sweep": False,
    "burstiness": None,
    "range_ratio": None,
    "warmup": None,
    "dataset": None,
    "colocated_choice": None,
}


def validate_duration_of(value: str | None) -> float:
    """--validate-duration's seconds; ValidationError on anything but 5-600."""
    if value is None:
        return DEFAULT_VALIDATE_S
    try:
        s = float(value)
    except ValueError:
        raise ValidationError(f"--validate-duration {value!r}: not a number of seconds") from None
    if not 5 <= s <= MAX_VALIDATE_S:
        raise ValidationError(f"--validate-duration {s:g}: must be between 5 and {MAX_VALIDATE_S:g} s")
    return s


def snapshot(deployment: Deployment) -> dict[str, Any]:
    """Every vLLM instance's /metrics series that the components read (pdfleet.plan.gaps.KEPT)."""
    import time

    from pdfleet.bench.fleet_targets import direct_targets
    from pdfleet.metrics.direct import DirectScrape
    from pdfleet.plan.gaps import KEPT

    targets = direct_targets(deployment.topology)
    snap = DirectScrape(targets).scrape()
    samples = [
        {"name": name, "labels": dict(labels), "value": value}
        for (name, labels), value in snap.samples.items()
        if name.startswith(KEPT)
    ]
    return {"at": time.time(), "instances": len(targets), "samples": samples}


def component_report(
    out_dir: Path,
    doc: dict[str, Any],
    layouts: dict[str, Layout],
    requests: list[Request],
    hw: Hardware,
    long_tokens: int,
    path: RequestPath = NOT_MODELLED,
) -> list[str]:
    """Per benched pool (a routed run: per pool it was served by): the gaps predicted, the instances' own
    (with DIR/server-before.json and server-after.json), the client's (DIR/requests.jsonl), and the
    client's own lateness; the mean TTFT the engines', the instances' own, the client's, and the `path`
    the prediction adds."""
    from pdfleet.bench.stats import gaps
    from pdfleet.plan.gaps import component_lines, deltas, ttft_lines
    from pdfleet.plan.predict import client_record, run

    files = [out_dir / f"server-{w}.json" for w in ("before", "after")]
    lab = {}
    out = []
    if all(f.exists() for f in files):
        before, after = (json.loads(f.read_text(encoding="utf-8"))["samples"] for f in files)
        lab = deltas(before, after)
    if "routed" in layouts and len(layouts) > 1 and lab:  # the routed run used the pools' instances too
        lab = {}
        out.append("validate: the routed run shares the pools' instances: their own gaps are not shown")
    sent = [json.loads(x) for x in (out_dir / "requests.jsonl").read_text(encoding="utf-8").splitlines() if x]
    for pool, layout in layouts.items():
        records, _ = run(layout, requests, hw)
        for part in ("colocated", "disagg") if pool == "routed" else (pool,):
            predicted = [gaps(client_record(r, rec, long_tokens)) for r, by, rec in records if by == part]
            client = [
                x["itl"]
                for x in sent
                if x["pool"] == pool and x["success"] and (pool != "routed" or x.get("served") == part)
            ]
            label = f"{pool}/{part}" if pool == "routed" else pool
            out.extend(component_lines(part, predicted, lab, client, label))
            first = [
                rec.token_times[0] - rec.arrival for _, by, rec in records if by == part and rec.token_times
            ]
            seen = [
                x["ttft"]
                for x in sent
                if x["pool"] == pool and x["success"] and (pool != "routed" or x.get("served") == part)
            ]
            out.extend(ttft_lines(part, first, lab, seen, label))
            if path.modelled and first:
                engines = 1000 * sum(first) / len(first)
                out.append(
                    f"{'':10} the request path modelled: mean {path.mean_ms(part):.1f} ms, so the client's "
                    f"predicted mean {engines + path.mean_ms(part):.1f} ms"
                )
        c = doc["pools"][pool]["pdfleet"]["client"]
        out.append(
            f"{pool:10} client: event-loop lag P99 {c['p99_loop_lag_ms']:.1f} ms, schedule lateness P99 "
            f"{c['p99_schedule_lateness_ms']:.1f} ms (delivery jitter the model has none of)"
        )
    return out


def run_validate(
    ctx: Context,
    profile: str,
    opts: dict[str, Any],
    decision: Decision,
    targets: Targets,
    out_dir: Path,
    console: Console,
    shares: Shares | None = None,
    path: RequestPath = NOT_MODELLED,
) -> list[str]:
    """Pick, bench, predict on the bench's requests, compare; the printed lines (also DIR/validate.txt).
    `shares`: the plan's traffic per threshold (a ranked hybrid routing as the fleet's is the fleet's);
    `path`: the request path the plan measured first (added to the prediction's first tokens)."""
    from pdfleet.bench.fleet_targets import bench_model
    from pdfleet.bench.stats import Bounds
    from pdfleet.cli.bench import run_bench
    from pdfleet.cli.options import open_deployment
    from pdfleet.cli.plan_fleet import current_of, hardware_of
    from pdfleet.plan.predict import simulate
    from pdfleet.plan.traffic import requests_of_results
    from pdfleet.plan.validate import lines, pick, pool_layouts, validate

    deployment = open_deployment(ctx, profile, opts["inventory"], fleet_layout=True)  # as it serves now
    model = opts["model"]
    current = current_of(deployment, model)
    fleet = pool_layouts(current.pools, current.threshold)
    picks = pick([r.prediction.layout for r in decision.rows], fleet, shares=shares)
    for p in picks:
        how = f"the fleet's {RUNS.get(str(p.pool), p.pool)}: measured" if p.pool else f"skipped: {p.skipped}"
        if p.pool and p.layout != fleet[p.pool]:
            how += f" (its {fleet[p.pool].name} routes the same requests of the plan's traffic)"
        console.print(f"validate: #{p.rank} {p.layout.name}: {how}", highlight=False, soft_wrap=True)
    measured = [p for p in picks if p.pool]
    if not measured:
        return ["validate: none of the ranked layouts is one of the fleet's pools; nothing measured"]
    bench_dir = out_dir / "validate"
    bench_opts = {
        **BENCH_DEFAULTS,
        **opts["bench"],
        "duration": str(opts["validate_duration"]),
        "pools": ",".join(str(p.pool) for p in measured),
        "stage": None,
        "stage_weights": LONG_TO_PD if any(p.pool == "routed" for p in measured) else None,
    }
    console.print(
        f"validate: benching {bench_opts['pools']} for {opts['validate_duration']:g} s each (seed "
        f"{opts['bench']['seed'] or 0}); nothing is moved, the fleet stays as it is"
    )
    bench_dir.mkdir(parents=True, exist_ok=True)
    for old in ("before", "after"):  # an earlier run's into the same --out must not pair with this one's
        (bench_dir / f"server-{old}.json").unlink(missing_ok=True)
    notes = _snapshot_to(deployment, bench_dir / "server-before.json")
    doc, _, _ = run_bench(ctx, profile, opts["inventory"], bench_opts, str(bench_dir), console)
    notes += _snapshot_to(deployment, bench_dir / "server-after.json")
    down = [f"validate: {pool}: {d['error']}" for pool, d in doc["pools"].items() if "error" in d]
    layouts = {
        str(p.pool): fleet[str(p.pool)] for p in measured if "error" not in doc["pools"].get(str(p.pool), {})
    }
    if not layouts:
        return [*down, "validate: no pool was measured: nothing to compare"]
    spec = bench_model(deployment.profile, model)
    requests = requests_of_results(doc)
    hw = hardware_of(deployment, model)
    long_tokens = deployment.profile.for_model(spec).gateway.long_prompt_tokens
    bounds = Bounds(**doc["slo_bounds_ms"])
    preds = {pool: simulate(lay, requests, hw, bounds, long_tokens, path) for pool, lay in layouts.items()}
    v = validate(preds, doc["pools"], targets, [p for p in picks if not p.pool])
    head = [
        f"validate: {len(requests)} requests, time scale {doc.get('time_scale', 1):g}",
        f"validate: {path.text()}",
        *down,
        *notes,
    ]
    if doc.get("partial"):
        head.append("validate: the bench was interrupted; the measurement is partial")
    body = (
        lines(v)
        + route_lines(preds, doc)
        + component_report(bench_dir, doc, layouts, requests, hw, long_tokens, path)
    )
    (bench_dir / "validate.txt").write_text("\n".join(head + body) + "\n", encoding="utf-8")
    return head + body


def route_lines(preds: dict[str, Prediction], doc: dict[str, Any]) -> list[str]:
    """A routed run's requests to P/D, predicted (the threshold on the plan's effective tokens) and measured
    (the gateway's X-Pdfleet-Pool), the decider's reasons, and the stage and threshold it routed by."""
    from pdfleet.bench.routes import routing_notes
    from pdfleet.gateway.decider import reason_mix_text

    if "routed" not in preds or "error" in doc["pools"].get("routed", {}):
        return []
    routes = doc["pools"]["routed"]["pdfleet"]["routes"]
    to_pd = sum(r["requests"] for name, r in routes.items() if name.startswith("disagg/"))
    reasons = doc["pools"]["routed"]["pdfleet"]["decider_reasons"]
    live = (doc.get("routing") or {}).get("long_prompt_tokens")
    threshold = preds["routed"].layout.threshold
    differs = (
        []
        if live == threshold
        else [f"routed: the gateway's threshold {live} is not the layout's {threshold}"]
    )
    return [
        *differs,
        f"routed: to P/D predicted {preds['routed'].to_pd}, measured {to_pd} of "
        f"{sum(r['requests'] for r in routes.values())} (reasons: {reason_mix_text(reasons)})",
        *(f"routed: {n}" for n in routing_notes(doc)),
    ]


def _snapshot_to(deployment: Deployment, path: Path) -> list[str]:
    """The instances' /metrics into `path`; a line saying why not when an instance does not answer (the
    instances' own gaps are then left out, the rest is compared)."""
    from pdfleet.metrics.source import MetricsUnavailable

    try:
        _write(path, snapshot(deployment))
    except MetricsUnavailable as exc:
        return [f"validate: no {path.stem} snapshot ({exc}): the instances' own gaps are not shown"]
    return []


def _write(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data) + "\n", encoding="utf-8")

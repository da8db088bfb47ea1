"""`invoke plan --measure-path` (and the first step of `--validate`): the request's path measured on the
fleet, per route, so that the prediction's TTFTs are the client's (pdfleet.plan.path says what it is).

A few warm-up requests per route (connections, TLS, the router kept alive, as the bench's are), the
instances' /metrics snapshotted, a burst of minimal requests (max_tokens 1, the smallest prompt) one at a
time per route through the gateway (its pool header forcing the route), the instances snapshotted again;
the pure part reads the path as the client's mean TTFT minus the instances' own over the burst. Without a
fleet: the profile's `plan.request_path`, else not modelled (0, stated).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pdfleet.plan.path import ROUTES

if TYPE_CHECKING:
    from pdfleet.bench.client import Record
    from pdfleet.bench.load import Gateway
    from pdfleet.fleet.deployment import Deployment
    from pdfleet.plan.path import RequestPath

BURST = 40  # minimal requests a route (~10 ms each colocated, ~25 ms P/D): the path's spread, its P95
WARM = 3  # unrecorded first: a kept-alive connection, as the bench's requests find it
PROMPT = "Hi"  # the smallest prompt: one or two tokens, a single prefill step


def path_of(
    deployment: Deployment, model: str | None, measure: bool, out_dir: Path
) -> tuple[RequestPath, list[str]]:
    """The request path the plan models: measured on the fleet (`measure`), else the profile's
    `plan.request_path`, else not modelled; and the lines to print (the measurement's per route)."""
    from pdfleet.plan.path import NOT_MODELLED, of_profile

    if measure:
        return measure_path(deployment, model, out_dir)
    given = deployment.profile.plan.request_path
    if given is None:
        return NOT_MODELLED, []
    profile = deployment.profile
    scale = profile.vllm.sim.time_scale if profile.vllm.engine == "sim" else 1.0
    return of_profile(given.colocated_ms, given.disagg_ms, given.source, profile.name, scale), []


def measure_path(deployment: Deployment, model: str | None, out_dir: Path) -> tuple[RequestPath, list[str]]:
    """The burst per route the fleet has, the snapshots around it, the path; OUT/path.json keeps the raw
    figures (the client's TTFTs, the snapshots) as the measurement's provenance."""
    from pdfleet.bench.fleet_targets import bench_model, gateway_of, pools_of, read_client_key
    from pdfleet.plan.gaps import deltas
    from pdfleet.plan.path import measured, route_figures

    profile = deployment.profile
    spec = bench_model(profile, model)
    routes = [r for r in ROUTES if r in pools_of(deployment.topology, spec.name)]
    gw = gateway_of(
        profile, deployment.topology, read_client_key(profile.gateway.client_key_file), spec.aliases[0]
    )
    scale = profile.vllm.sim.time_scale if profile.vllm.engine == "sim" else 1.0
    at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    records, before, after = asyncio.run(_burst(deployment, gw, routes))
    lab = deltas(before["samples"], after["samples"])
    client = {r: [rec.ttft / scale for rec in records[r] if rec.success] for r in routes}
    failed = {r: next((rec.error for rec in records[r] if not rec.success), "") for r in routes}
    figs = [route_figures(r, client[r], lab) for r in routes]
    where = f"{profile.name}'s gateway {gw.host}:{gw.port}, {BURST} minimal requests a route"
    path, lines = measured(figs, at, where, scale)
    lines += [f"request path {r}: a failed request: {e}" for r, e in failed.items() if e]
    out_dir.mkdir(parents=True, exist_ok=True)
    raw = {"path": path.doc(), "time_scale": scale, "client_ttft_s": client, "before": before, "after": after}
    (out_dir / "path.json").write_text(json.dumps(raw) + "\n", encoding="utf-8")
    return path, [*lines, path.text()]


async def _burst(
    deployment: Deployment, gw: Gateway, routes: list[str]
) -> tuple[dict[str, list[Record]], dict[str, Any], dict[str, Any]]:
    """Warm-ups, the snapshot before, the bursts one request at a time, the snapshot after."""
    from pdfleet.bench.client import Record
    from pdfleet.bench.load import gateway_request
    from pdfleet.cli.plan_validate import snapshot

    client = gw.client()
    try:
        for route in routes:
            for _ in range(WARM):
                await client.run(
                    gateway_request(gw, route, PROMPT, 1), Record(pool=route, max_tokens=1), False
                )
        before = await asyncio.to_thread(snapshot, deployment)
        records: dict[str, list[Record]] = {}
        for route in routes:
            records[route] = []
            for _ in range(BURST):
                rec = Record(pool=route, max_tokens=1)
                await client.run(gateway_request(gw, route, PROMPT, 1), rec)
                records[route].append(rec)
        after = await asyncio.to_thread(snapshot, deployment)
    finally:
        client.close()
    return records, before, after

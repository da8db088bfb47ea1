"""A Grafana dashboard (JSON the operator imports) of the request chain, from the topology and the rules.

One row per part of the chain: the gateway's view per pool and length class, vLLM's per pool and role,
KV transfer, queues and running requests, KV cache and preemptions, stalls/jitter/fallbacks, routing
decisions by stage, and scrape health; then the hosts' rows (`pdfleet.monitoring.host_panels`). Every
chain panel reads a recorded series of `pdfleet.monitoring.recording` (or `up`), so the dashboard, the
alerts and `invoke monitor` agree. A
`model` variable (one option per model the profile serves) narrows every per-model series to one model:
its `model` label is the model's name or one of its aliases (a single-model gateway labels by alias).
"""

from __future__ import annotations

import json
import re
from typing import Any

from pdfleet.fleet.topology import GATEWAY_POOL, Topology
from pdfleet.metrics.bounds import first_bound
from pdfleet.model.profile import Profile
from pdfleet.monitoring.host_panels import host_rows
from pdfleet.monitoring.panels import Panel, Query
from pdfleet.monitoring.recording import QUANTILES, Step, chain_figures, chain_steps

DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
MODEL_MATCH = 'model=~"$model"'  # a custom variable whose value is a regex: name|alias|...
WIDTH = 12
HEIGHT = 8


def _pools(topology: Topology) -> list[str]:
    """The gateway pools the topology serves, in a stable order."""
    present = {GATEWAY_POOL[i.pool] for i in topology.instances}
    return [p for p in ("colocated", "disagg") if p in present]


def _roles(topology: Topology) -> list[str]:
    present = {i.pool for i in topology.instances}
    return [r for r in ("prefill", "decode", "colocated") if r in present]


def _of_model(series: str, match: str = "") -> str:
    """A recorded series of the chosen model (and `match`, e.g. `pool="disagg"`)."""
    return f"{series}{{{', '.join(m for m in (match, MODEL_MATCH) if m)}}}"


def _quantile_panel(step: Step, title: str, match: str, legend: str, description: str = "") -> Panel:
    """A panel of a step's recorded quantiles; inside the histogram's first bucket it shows `<bound`
    (vLLM's request times: `<300 ms`), never the interpolated figure."""
    first = first_bound(step.histogram)
    if first is not None:
        bound = f"{1000 * first:g} ms"
        note = f"Under {bound} a quantile is inside the histogram's first bucket: shown as <{bound}."
        description = f"{description} {note}".strip()
    return Panel(title, _quantile_queries(step, match, legend), description=description, first_bucket_s=first)


def _quantile_queries(step: Step, match: str, legend: str) -> tuple[Query, ...]:
    return tuple(Query(_of_model(step.recorded(q), match), f"{legend} P{q * 100:g}") for q in QUANTILES)


def _regex(value: str) -> str:
    """A label value as a regex inside a PromQL double-quoted string (Grafana pastes it in unescaped)."""
    return re.escape(value).replace("\\", "\\\\").replace('"', '\\"')


def model_variable(profile: Profile) -> dict[str, Any]:
    """Grafana's `model` variable: one option per served model, its value the regex of its label values."""
    options = [
        {"text": spec.name, "value": "|".join(_regex(v) for v in dict.fromkeys((spec.name, *spec.aliases)))}
        for spec in profile.served
    ]
    return {
        "name": "model",
        "label": "model",
        "type": "custom",
        "query": ",".join(f"{o['text']} : {o['value']}" for o in options),
        "current": {**options[0], "selected": True},
        "options": [{**o, "selected": i == 0} for i, o in enumerate(options)],
        "multi": False,
        "includeAll": False,
    }


def _prefix_panel(estimated: bool) -> Panel:
    """Prefix-cache hit tokens/s in vLLM, beside the gateway's estimate of them where a gateway keeps a prefix
    index (colocated: the colocated instances' hits, disagg: the prefill instances')."""
    queries = [Query(_of_model("pool_role:vllm_prefix_cache_hits:rate"), "vLLM hits {{pool}} {{role}}")]
    if estimated:
        queries.append(
            Query(_of_model("pool:gateway_prefix_estimate_cached_tokens:rate"), "estimate {{pool}}")
        )
    return Panel(
        "Prefix-cache hit tokens/s",
        tuple(queries),
        unit="short",
        description="The gateway's estimate counts only while its decider keeps a prefix index; over it, "
        "the engines evicted what the gateway cannot see (docs/gateway.md).",
    )


def chain_panels(profile: Profile, topology: Topology) -> list[tuple[str, list[Panel]]]:
    """(row title, panels) of the whole dashboard."""
    has_gateway = bool(topology.gateways)
    steps = chain_steps(profile, has_gateway)
    figures = sorted(f.name for f in chain_figures(profile, has_gateway))
    rows: list[tuple[str, list[Panel]]] = []
    gw_steps = [s for s in steps if s.source == "gateway"]
    if gw_steps:
        panels = [
            _quantile_panel(step, f"{step.title} — {pool} pool", f'pool="{pool}"', "{{length_class}}")
            for step in gw_steps
            for pool in _pools(topology)
        ]
        rows.append(("The chain at the gateway, per pool and length class", panels))
    vllm_steps = [s for s in steps if s.source == "vllm" and s.key != "kv_transfer"]
    panels = [
        _quantile_panel(step, f"{step.title} — {role} instances", f'role="{role}"', "{{pool}}")
        for step in vllm_steps
        for role in _roles(topology)
    ]
    rows.append(("The chain in vLLM, per pool and role (vLLM has no length class)", panels))
    kv = [s for s in steps if s.key == "kv_transfer"]
    if kv:
        histograms = ", ".join(kv[0].histograms)  # each P/D model's connector's, recorded as one series
        panels = [
            _quantile_panel(
                kv[0],
                f"KV transfer time ({histograms})",
                "",
                "{{role}}",
                description=f"Over {profile.monitoring.kv_transfer_p95_ms:g} ms at P95: the transport "
                "is the bottleneck.",
            )
        ]
        failed = [name for name in figures if name.endswith("_failed_transfers:rate")]
        if failed:
            queries = tuple(Query(_of_model(name), "{{role}}") for name in failed)
            panels.append(Panel("Failed KV transfers", queries, unit="reqps"))
        rows.append(("KV transfer", panels))
    rows.append(
        (
            "Queues",
            [
                Panel(
                    "Waiting requests",
                    (Query(_of_model("pool_role:vllm_num_requests_waiting:sum"), "{{pool}} {{role}}"),),
                    unit="short",
                ),
                Panel(
                    "Running requests",
                    (Query(_of_model("pool_role:vllm_num_requests_running:sum"), "{{pool}} {{role}}"),),
                    unit="short",
                ),
                Panel(
                    "Finished requests/s",
                    (Query(_of_model("pool_role:vllm_requests:rate"), "{{pool}} {{role}}"),),
                    unit="reqps",
                ),
                Panel(
                    "Tokens/s",
                    (
                        Query(_of_model("pool_role:vllm_prompt_tokens:rate"), "prompt {{role}}"),
                        Query(_of_model("pool_role:vllm_generation_tokens:rate"), "generated {{role}}"),
                    ),
                    unit="short",
                ),
            ],
        )
    )
    rows.append(
        (
            "KV cache and preemptions",
            [
                Panel(
                    "KV cache usage (busiest instance)",
                    (Query(_of_model("pool_role:vllm_kv_cache_usage_perc:max"), "{{pool}} {{role}}"),),
                    unit="percentunit",
                ),
                Panel(
                    "Preemptions per minute",
                    (Query(_of_model("pool_role:vllm_num_preemptions:per_min"), "{{pool}} {{role}}"),),
                    unit="short",
                ),
                _prefix_panel(has_gateway and profile.gateway.decider.reads_cache),
            ],
        )
    )
    if has_gateway:
        rows.append(
            (
                "Streams and fallbacks",
                [
                    Panel(
                        "Stalls per minute",
                        (
                            Query(
                                _of_model("pool_class:gateway_stream_stalls:per_min"),
                                "{{pool}} {{length_class}}",
                            ),
                        ),
                        unit="short",
                    ),
                    Panel(
                        "Stream jitter (gap P99 − P50)",
                        (
                            Query(
                                _of_model("pool_class:gateway_chunk_gap_seconds:jitter"),
                                "{{pool}} {{length_class}}",
                            ),
                        ),
                    ),
                    Panel(
                        "Fallbacks per request",
                        (Query("fleet:gateway_fallback:ratio", "fallback ratio"),),
                        unit="percentunit",
                    ),
                    Panel(
                        "Requests, 5xx and cut streams /s",
                        (
                            Query(_of_model("pool_class:gateway_requests:rate"), "{{pool}} {{length_class}}"),
                            Query(
                                _of_model("pool_class:gateway_errors:rate"), "5xx {{pool}} {{length_class}}"
                            ),
                            Query(_of_model("pool:gateway_stream_errors:rate"), "cut {{pool}}"),
                        ),
                        unit="reqps",
                    ),
                ],
            )
        )
        rows.append(
            (
                "Routing",
                [
                    Panel(
                        "Routing decisions by stage",
                        (
                            Query(
                                _of_model("stage_class_pool_reason:gateway_routing_decisions:rate"),
                                "{{stage}} {{length_class}} → {{pool}} ({{reason}})",
                            ),
                        ),
                        unit="reqps",
                    ),
                ],
            )
        )
    rows.append(
        (
            "Scrape targets",
            [
                Panel("Targets up", (Query("up", "{{job}} {{host}}"),), unit="short"),
            ],
        )
    )
    return rows


def _mappings(panel: Panel) -> list[dict[str, Any]]:
    """Grafana value mappings: a quantile inside the first bucket reads `<bound` (to is inclusive: the bound
    itself, every observation at or under it, also reads `<bound`, a hair generous)."""
    if panel.first_bucket_s is None:
        return []
    text = f"<{1000 * panel.first_bucket_s:g} ms"
    return [{"type": "range", "options": {"from": 0, "to": panel.first_bucket_s, "result": {"text": text}}}]


def _panel_json(panel: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    return {
        "id": pid,
        "type": "timeseries",
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": HEIGHT, "w": WIDTH, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": panel.unit, "mappings": _mappings(panel)}, "overrides": []},
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": q.expr, "legendFormat": q.legend}
            for i, q in enumerate(panel.queries)
        ],
        **panel.extra,
    }


def dashboard(profile: Profile, topology: Topology) -> dict[str, Any]:
    """The dashboard model: rows of two-column panels, a Prometheus datasource chosen on import."""
    panels: list[dict[str, Any]] = []
    y, pid = 0, 1
    for title, row in [*chain_panels(profile, topology), *host_rows(profile)]:
        panels.append(
            {
                "id": pid,
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        pid, y = pid + 1, y + 1
        for i, panel in enumerate(row):
            panels.append(_panel_json(panel, pid, (i % 2) * WIDTH, y + (i // 2) * HEIGHT))
            pid += 1
        y += ((len(row) + 1) // 2) * HEIGHT
    return {
        "__inputs": [
            {
                "name": "DS_PROMETHEUS",
                "label": "Prometheus",
                "type": "datasource",
                "pluginId": "prometheus",
                "pluginName": "Prometheus",
            }
        ],
        "title": f"pdfleet — {profile.name}",
        "uid": f"pdfleet-{profile.name}"[:40],
        "tags": ["pdfleet", "vllm"],
        "timezone": "utc",
        "schemaVersion": 39,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [model_variable(profile)]},
        "annotations": {"list": []},
        "panels": panels,
    }


def panel_queries(model: dict[str, Any]) -> list[str]:
    """Every query expression of a dashboard model (what the tests check)."""
    return [t["expr"] for p in model["panels"] for t in p.get("targets", [])]


def dashboard_json(profile: Profile, topology: Topology) -> str:
    return json.dumps(dashboard(profile, topology), indent=2, ensure_ascii=False) + "\n"

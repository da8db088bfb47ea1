"""The request chain as a terminal table (`invoke monitor`): now (the recorded series) and over the last
N minutes (quantiles straight from the histograms), per pool and length class or pool and role.

A cell without data says so ("no data"): a histogram with no observation in the window, or a series
no target exports. A Prometheus that does not answer is an error for the caller, never an empty table.
The rows are read per model (the `model` label the rules keep) and shown a model at a time (`of_model`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from urllib.parse import urlparse

from pdfleet.errors import ValidationError
from pdfleet.fleet.topology import Topology
from pdfleet.metrics.bounds import BUCKETS, below_first
from pdfleet.metrics.prometheus import PrometheusClient
from pdfleet.metrics.source import SeriesAbsent
from pdfleet.model.profile import Profile
from pdfleet.model.served import ServedModel
from pdfleet.monitoring.recording import MODEL, QUANTILES, Figure, Step, chain_figures, chain_steps

NO_DATA = "no data"
Group = tuple[str, ...]


@dataclass(frozen=True)
class StepRows:
    """One chain step: per group, the quantiles now and over the window (None: no data)."""

    step: Step
    now: dict[Group, dict[float, float | None]]
    window: dict[Group, dict[float, float | None]]


@dataclass(frozen=True)
class FigureRows:
    figure: Figure
    values: dict[Group, float]


@dataclass(frozen=True)
class ChainTable:
    steps: tuple[StepRows, ...]
    figures: tuple[FigureRows, ...]
    window_s: int
    rule_window_s: int


def prometheus_url(topology: Topology, override: str | None) -> str:
    """The Prometheus to read: --prometheus, else the topology's (the first monitoring host, the profile's
    monitoring.port)."""
    if override:
        parsed = urlparse(override)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValidationError(
                f"--prometheus: {override!r} is not an http(s) URL like http://10.0.0.5:9090"
            )
        return override.rstrip("/")
    if topology.prometheus is None:
        raise ValidationError(
            "the inventory has no host in group `monitoring`: add one and provision it "
            "(invoke provision --roles base,monitoring), or pass --prometheus URL"
        )
    return topology.prometheus.url


def _absent_to_none(read: dict[float, dict[Group, float]], q: float, group: Group) -> float | None:
    value = read.get(q, {}).get(group)
    return None if value is None or math.isnan(value) else value


def _step_rows(client: PrometheusClient, step: Step, window_s: int) -> StepRows:
    now: dict[float, dict[Group, float]] = {}
    over: dict[float, dict[Group, float]] = {}
    for q in QUANTILES:
        try:
            now[q] = client.grouped(step.recorded(q), step.group, step.recorded(q))
        except SeriesAbsent:
            now[q] = {}
        try:
            over[q] = client.quantile(q, step.histogram, window_s, by=step.group)
        except SeriesAbsent:
            over[q] = {}
    groups = sorted({g for table in (*now.values(), *over.values()) for g in table})
    return StepRows(
        step,
        {g: {q: _absent_to_none(now, q, g) for q in QUANTILES} for g in groups},
        {g: {q: _absent_to_none(over, q, g) for q in QUANTILES} for g in groups},
    )


def read_chain(client: PrometheusClient, profile: Profile, topology: Topology, minutes: float) -> ChainTable:
    """Every step and figure this deployment records (MetricsUnavailable when Prometheus is down)."""
    window_s = int(minutes * 60)
    if window_s < 60:
        raise ValidationError(f"--minutes: {minutes:g} is less than one minute")
    has_gateway = bool(topology.gateways)
    steps = tuple(_step_rows(client, s, window_s) for s in chain_steps(profile, has_gateway))
    figures = []
    for figure in chain_figures(profile, has_gateway):
        try:
            values = client.grouped(figure.name, figure.labels, figure.name)
        except SeriesAbsent:
            values = {}
        figures.append(FigureRows(figure, {k: v for k, v in values.items() if not math.isnan(v)}))
    return ChainTable(steps, tuple(figures), window_s, profile.monitoring.rule_window_s)


def model_labels(spec: ServedModel) -> frozenset[str]:
    """The `model` label values of a model's series: its name (vLLM and router targets, its gateway group)
    and its aliases (a single-model profile's gateway has no group: its series carry the alias)."""
    return frozenset((spec.name, *spec.aliases))


def _mine(group: Group, names: frozenset[str]) -> bool:
    return bool(group) and group[0] in names


def of_model(table: ChainTable, names: frozenset[str]) -> ChainTable:
    """The table of one model: the rows whose `model` label is one of `names`, without that label; the
    fleet-wide figures (no labels) as they are."""
    steps = tuple(
        replace(
            sr,
            now={g[1:]: v for g, v in sr.now.items() if _mine(g, names)},
            window={g[1:]: v for g, v in sr.window.items() if _mine(g, names)},
        )
        for sr in table.steps
    )
    figures = tuple(
        replace(fr, values={g[1:]: v for g, v in fr.values.items() if _mine(g, names)})
        if fr.figure.labels[:1] == (MODEL,)
        else fr
        for fr in table.figures
    )
    return replace(table, steps=steps, figures=figures)


def fmt_seconds(value: float | None, bounds: tuple[float, ...] = ()) -> str:
    """A quantile as the table shows it; inside the histogram's first bucket (`bounds`, its upper bounds)
    only `<bound` is known (vLLM's request times: `<300 ms`, never the interpolated 150/285/297 ms)."""
    if value is None:
        return NO_DATA
    if below_first(value, bounds):
        return f"<{fmt_seconds(bounds[0])}"
    if value < 1:
        return f"{value * 1000:.0f} ms" if value >= 0.01 else f"{value * 1000:.1f} ms"
    return f"{value:.2f} s"


def _columns(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def format_table(table: ChainTable, title: str) -> str:
    """The chain table, then the figures; `no data` where there is none."""
    minutes = f"{table.window_s / 60:g} min"
    head = [
        "step",
        "pool",
        "class/role",
        *(f"P{q * 100:g} now" for q in QUANTILES),
        *(f"P{q * 100:g} {minutes}" for q in QUANTILES),
    ]
    rows = [head]
    for sr in table.steps:
        if not sr.now:
            rows.append([sr.step.title, "-", "-", *[NO_DATA] * (2 * len(QUANTILES))])
        bounds = BUCKETS.get(sr.step.histogram, ())
        for group in sr.now:
            rows.append(
                [
                    sr.step.title,
                    *group,
                    *(fmt_seconds(sr.now[group][q], bounds) for q in QUANTILES),
                    *(fmt_seconds(sr.window[group][q], bounds) for q in QUANTILES),
                ]
            )
    lines = [
        title,
        f"now = the rules' {table.rule_window_s} s window; {minutes} = quantiles of the "
        "histograms over that span; `<300 ms`: inside the histogram's first bucket, where a quantile "
        "says no more",
        "",
        *_columns(rows),
        "",
    ]
    figure_rows = [["figure (now)", "labels", "value"]]
    for fr in table.figures:
        if not fr.values:
            figure_rows.append([fr.figure.title, "-", NO_DATA])
        for group, value in sorted(fr.values.items()):
            figure_rows.append([fr.figure.title, " ".join(group) or "all", f"{value:.3g}"])
    return "\n".join([*lines, *_columns(figure_rows)]) + "\n"

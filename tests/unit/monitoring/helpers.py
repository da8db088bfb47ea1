"""Rule unit tests for promtool (`promtool test rules`): input series written by hand, expected values
worked out by hand, run against the rule files the monitoring role renders.

A case names one recorded series, the raw series it is fed (counters as a steady increase per second,
gauges as a constant) and the value each output series must have. Steady counters make every `rate()`
exact whatever the profile's window, so one case holds for every profile. Values are compared rounded to
1e-6: promtool compares floats exactly, and rate()'s extrapolation leaves the last bits to chance.
"""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

import roles.monitoring as monitoring
from pdfleet.model.profile import Profile
from pdfleet.monitoring.alerts import alert_rules
from pdfleet.monitoring.monitoring_config import ALERTS_FILE, RECORDING_FILE, dump
from pdfleet.monitoring.recording import recording_rules
from tests.unit.fleet.helpers import fleet_of, profile_inventory_pairs, series_in
from tests.unit.metrics.helpers import promtool

PRECISION = 1e-6


@dataclass(frozen=True)
class Series:
    """One input series: `name{labels}`, a counter rising `per_s` a second from 0, or a constant gauge."""

    name: str
    per_s: float = 0.0
    value: float = 0.0

    def values(self, interval_s: int, samples: int) -> str:
        """promtool's expanding notation: start, then the same step `samples` times."""
        return f"{self.value:.10g}+{self.per_s * interval_s:.10g}x{samples}"


@dataclass(frozen=True)
class RuleCase:
    """A recorded series, what it is fed, and its expected output series (labels → value)."""

    record: str
    catches: str  # the mistake this case fails on
    inputs: tuple[Series, ...]
    expected: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class AlertCase:
    """An alert, what it is fed, and the label sets (besides alertname/severity) it fires for."""

    alert: str
    catches: str
    inputs: tuple[Series, ...]
    firing: tuple[str, ...]  # e.g. 'pool="disagg", role="decode"'; () for an alert that must stay quiet


def buckets(histogram: str, labels: str, cumulative_per_s: Mapping[str, float]) -> tuple[Series, ...]:
    """A histogram's `_bucket` counters: per `le`, the observations a second at or below it."""
    return tuple(
        Series(f'{histogram}_bucket{{{labels}, le="{le}"}}', per_s=rate)
        for le, rate in cumulative_per_s.items()
    )


@dataclass(frozen=True)
class Timing:
    """The profile's cadence the rule files run at: scrape (input step), evaluation, window and `for:`."""

    scrape_s: int
    evaluation_s: int
    window_s: int
    for_s: int

    @property
    def eval_s(self) -> int:
        """Late enough for a full window of steady input and an alert's `for:` to have passed."""
        return self.window_s + self.for_s + 5 * max(self.evaluation_s, self.scrape_s)

    @property
    def samples(self) -> int:
        return self.eval_s // self.scrape_s + 5


@dataclass(frozen=True)
class Rendering:
    """The recording and alert rule files one monitoring host gets, and the profile's cadence."""

    where: str  # profile, inventory and host, or "(no gateway)"
    recording: str
    alerts: str
    profile: Profile
    has_gateway: bool

    @property
    def files(self) -> dict[str, str]:
        return {"recording.yml": self.recording, "alerts.yml": self.alerts}

    @property
    def timing(self) -> Timing:
        mon = self.profile.monitoring
        return Timing(mon.scrape_interval_s, mon.evaluation_interval_s, mon.rule_window_s, mon.alert_for_s)

    def records(self) -> dict[str, str]:
        """Recorded name → its expression."""
        doc = yaml.safe_load(self.recording)
        return {r["record"]: r["expr"] for g in doc["groups"] for r in g["rules"]}

    def alerts_by_name(self) -> dict[str, dict[str, Any]]:
        return {r["alert"]: r for g in yaml.safe_load(self.alerts)["groups"] for r in g["rules"]}

    def reads(self, expr: str) -> set[str]:
        """Every series an expression reads, through the recorded series it reads down to raw ones."""
        records = self.records()
        todo, found = list(series_in(expr)), set()
        while todo:
            name = todo.pop()
            if name not in found:
                found.add(name)
                todo += series_in(records[name]) if name in records else []
        return found


@functools.cache
def renderings(profile_name: str) -> tuple[Rendering, ...]:
    """A profile's rule files as the monitoring role renders them (on the first inventory it deploys with;
    every shipped inventory has gateways, and the files depend on the profile and on that alone), and the
    generators' files for a fleet without a gateway."""
    inventory = next(inv for name, inv in profile_inventory_pairs() if name == profile_name)
    fleet = fleet_of(profile_name, inventory)
    host = next(h for h in fleet.inventory.hosts.values() if h.in_group("monitoring"))
    files = {f.path: f.content for f in monitoring.files(fleet.context(host))}
    profile, has_gateway = fleet.profile, bool(fleet.topology.gateways)
    where = f"{profile_name} on {inventory.name} ({host.name})"
    found = [Rendering(where, files[RECORDING_FILE], files[ALERTS_FILE], profile, has_gateway)]
    bare = (dump(recording_rules(profile, False)), dump(alert_rules(profile, False)))
    if has_gateway:
        found.append(Rendering(f"{profile_name} (no gateway)", *bare, profile, False))
    return tuple(found)


def _series(inputs: Iterable[Series], timing: Timing) -> list[dict[str, str]]:
    return [{"series": s.name, "values": s.values(timing.scrape_s, timing.samples)} for s in inputs]


@dataclass(frozen=True)
class Check:
    """One promtool expression test, the inputs it needs, and every metric name it touches (its inputs',
    and those the rules under test read), so checks that share none can share one test group."""

    inputs: tuple[Series, ...]
    expr_test: dict[str, object]
    names: frozenset[str]


def _metric(series: Series) -> str:
    return series.name.split("{", 1)[0]


def rule_check(case: RuleCase, reads: Iterable[str], timing: Timing) -> Check:
    """The case's record (rounded) at the evaluation time: exactly the expected series and values."""
    samples = [{"labels": labels, "value": value} for labels, value in case.expected.items()]
    test: dict[str, object] = {
        "expr": f"round({case.record}, {PRECISION:g})",
        "eval_time": f"{timing.eval_s}s",
        "exp_samples": samples,
    }
    return Check(case.inputs, test, frozenset({case.record, *reads, *map(_metric, case.inputs)}))


def alert_check(case: AlertCase, severity: str, reads: Iterable[str], timing: Timing) -> Check:
    """The alert's ALERTS series at the evaluation time: firing for exactly the case's label sets."""
    base = f'__name__="ALERTS", alertname="{case.alert}", alertstate="firing", severity="{severity}"'
    samples = [
        {"labels": "{" + ", ".join([base, *([f] if f else [])]) + "}", "value": 1} for f in case.firing
    ]
    test: dict[str, object] = {
        "expr": f'ALERTS{{alertname="{case.alert}", alertstate="firing"}}',
        "eval_time": f"{timing.eval_s}s",
        "exp_samples": samples,
    }
    return Check(case.inputs, test, frozenset({case.alert, *reads, *map(_metric, case.inputs)}))


def promtool_groups(checks: Iterable[Check], timing: Timing) -> list[dict[str, object]]:
    """promtool test groups: checks on the same inputs together, and checks touching disjoint metric names
    packed into one group (promtool evaluates every rule at every step of every group: fewer is faster)."""
    units: dict[tuple[Series, ...], list[Check]] = {}
    for check in checks:
        units.setdefault(check.inputs, []).append(check)
    packed: list[tuple[set[str], list[Series], list[dict[str, object]]]] = []
    for inputs, same in units.items():
        names = set().union(*(c.names for c in same))
        group = next((g for g in packed if g[0].isdisjoint(names)), None)
        if group is None:
            group = (set(), [], [])
            packed.append(group)
        group[0].update(names)
        group[1].extend(inputs)
        group[2].extend(c.expr_test for c in same)
    return [
        {
            "interval": f"{timing.scrape_s}s",
            "input_series": _series(inputs, timing),
            "promql_expr_test": tests,
        }
        for _, inputs, tests in packed
    ]


def run_rule_tests(
    rule_files: Mapping[str, str], checks: Iterable[Check], timing: Timing, tmp: Path
) -> subprocess.CompletedProcess[str]:
    """Write the rule files (name → text) and one test file beside them, run `promtool test rules`."""
    tmp.mkdir(parents=True, exist_ok=True)
    for name, text in rule_files.items():
        (tmp / name).write_text(text)
    doc = {
        "rule_files": sorted(rule_files),
        "evaluation_interval": f"{timing.evaluation_s}s",
        "tests": promtool_groups(checks, timing),
    }
    test_file = tmp / "rule-tests.yml"
    test_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    return promtool("test", "rules", str(test_file))

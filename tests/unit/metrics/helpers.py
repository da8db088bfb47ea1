"""A real Prometheus (Debian's package) on 127.0.0.1 for the tests, and an exporter whose numbers they set."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, start_http_server

from pdfleet.bench.procs import free_port, stop_processes, wait_http
from pdfleet.metrics.prometheus import PrometheusClient
from pdfleet.monitoring.monitoring_config import VLLM_NAME_RELABEL

PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"


def need_prometheus() -> None:
    """Skip (with how to fix it) when Debian's prometheus package is not installed."""
    if not (shutil.which(PROMETHEUS) and shutil.which(PROMTOOL)):
        pytest.skip("prometheus/promtool not installed (./dev setup installs Debian's prometheus package)")


@dataclass
class Exporter:
    """A prometheus_client registry served on 127.0.0.1:port."""

    registry: CollectorRegistry
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"


@contextmanager
def exporter() -> Iterator[Exporter]:
    """A fresh registry on a free loopback port."""
    registry = CollectorRegistry()
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        yield Exporter(registry, port)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@dataclass
class RunningPrometheus:
    """A Prometheus server the test started, and a client for it."""

    port: int
    proc: subprocess.Popen[bytes]
    config: Path
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def client(self) -> PrometheusClient:
        return PrometheusClient(self.url)


def scrape_config(
    targets: list[tuple[str, Mapping[str, str]]], interval_s: int = 1, rule_files: list[str] | None = None
) -> str:
    """A minimal prometheus.yml scraping `host:port` targets with their labels (vLLM's names restored
    as the monitoring role's config does: prometheus_client's OpenMetrics output writes `vllm_`)."""
    doc = {
        "global": {"scrape_interval": f"{interval_s}s", "evaluation_interval": f"{interval_s}s"},
        "rule_files": rule_files or [],
        "scrape_configs": [
            {
                "job_name": "test",
                "static_configs": [
                    {"targets": [address], "labels": dict(labels)} for address, labels in targets
                ],
                "metric_relabel_configs": [VLLM_NAME_RELABEL],
            }
        ],
    }
    return yaml.safe_dump(doc, sort_keys=False)


@contextmanager
def prometheus(tmp: Path, config_text: str) -> Iterator[RunningPrometheus]:
    """Run Prometheus on a free loopback port with this config until the block ends."""
    need_prometheus()
    tmp.mkdir(parents=True, exist_ok=True)
    config = tmp / "prometheus.yml"
    config.write_text(config_text)
    port = free_port()
    log = tmp / "prometheus.log"
    argv = [
        PROMETHEUS,
        f"--config.file={config}",
        f"--storage.tsdb.path={tmp / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--web.enable-lifecycle",
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_http(f"http://127.0.0.1:{port}/-/ready", timeout=60, proc=proc, log=log)
        yield RunningPrometheus(port, proc, config, log)
    finally:
        stop_processes([proc])


def wait_until(check: Callable[[], Any], timeout: float, what: str, every: float = 0.2) -> Any:
    """Poll check() until it returns something truthy, and return that; fail naming `what` after timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(every)
    got = check()  # a last look: a process starved through the deadline has not seen the end state yet
    if got:
        return got
    raise AssertionError(f"{what} did not happen within {timeout:g} s")


def wait_for(check: Callable[[], bool], timeout: float = 30.0, what: str = "the condition") -> None:
    """Poll check() until it is true; fail the test with `what` after timeout."""
    wait_until(check, timeout, what)


def samples_seen(client: PrometheusClient, expr: str, at_least: int, series: int = 1) -> Callable[[], bool]:
    """A check: Prometheus holds at least `at_least` scraped samples of expr (a plain selector) in 30 s, in
    each of at least `series` series. Each target is scraped at its own offset, and a scrape can fail while
    another target's succeeds: where expr is on several targets, name how many, or a target not scraped
    yet is simply not among the series this counts."""

    def check() -> bool:
        found = client.instant(f"count_over_time({expr}[30s])")
        return len(found) >= series and bool(found) and min(s.value for s in found) >= at_least

    return check


def each_seen(client: PrometheusClient, at_least: int, series: Mapping[str, int]) -> Callable[[], bool]:
    """A check: samples_seen for each expr with its number of series, all at once (one per target)."""
    checks = [samples_seen(client, expr, at_least, n) for expr, n in series.items()]
    return lambda: all(check() for check in checks)


def observation_counts(client: PrometheusClient, *histograms: str) -> list[list[float]]:
    """Per histogram, the `_count` of each of its series as Prometheus last scraped them, sorted."""
    return [sorted(s.value for s in client.instant(f"{name}_count")) for name in histograms]


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    """Run promtool; the completed process (the caller asserts on returncode and output)."""
    need_prometheus()
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60, check=False)


def check_config_tree(
    config_text: str, rule_texts: Mapping[str, str], tmp: Path
) -> subprocess.CompletedProcess[str]:
    """`promtool check config` on a rendered prometheus.yml whose rule files (absolute host paths) are
    written under tmp and pointed at there (the file itself is unchanged otherwise)."""
    doc = yaml.safe_load(config_text)
    local = []
    for path in doc.get("rule_files", []):
        dest = tmp / path.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(rule_texts[path])
        local.append(str(dest))
    doc["rule_files"] = local
    config = tmp / "prometheus.yml"
    config.write_text(yaml.safe_dump(doc, sort_keys=False))
    return promtool("check", "config", str(config))


def check_promql(exprs: list[str], tmp: Path) -> subprocess.CompletedProcess[str]:
    """Every expression parsed by promtool (as recording rules: `check rules` parses each expr)."""
    rules = {
        "groups": [
            {
                "name": "check",
                "rules": [{"record": f"pdfleet_check_{i}", "expr": e} for i, e in enumerate(exprs)],
            }
        ]
    }
    path = tmp / "exprs.yml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    return promtool("check", "rules", str(path))

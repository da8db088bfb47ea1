"""Monitoring as `invoke provision --profile lab-cross` deploys it on lab-gw: every target up; after
streamed traffic through the gateway to both pools each recording rule has a value per pool; a slowed
KV link (the simulator's --sim-link) fires the KV-transfer alert and restoring it resolves it; a second
provision changes nothing and a changed rule file is checked and reloaded, not restarted; `invoke
monitor` shows the chain; every host's node exporter is up and the dashboard's host rows have data; a
stopped decode service fires the pool-down alert through Alertmanager to the lab's recorder, and
starting it resolves it."""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import openai
import pytest

from pdfleet.metrics.prometheus import PrometheusClient
from pdfleet.monitoring.host_panels import host_rows
from pdfleet.monitoring.recording import chain_figures, chain_steps
from roles import REGISTRY
from tests.lab.helpers import (
    REPO_ROOT,
    LabHandle,
    derived_profile,
    lab_deployment,
    lab_env,
    prometheus_url,
)

INVOKE = [sys.executable, "-m", "invoke"]
PROFILE = "lab-cross"
MODEL = "llama-3.1-8b"
PROMETHEUS_URL = prometheus_url(PROFILE)  # lab-gw on lab-cross's monitoring.port (not 9090)
POOL_HEADER = "X-Pdfleet-Pool"
LONG_PROMPT = "word " * (16_000 * 4 // 5)  # ≈ 16K tokens at 4 chars/token: a long-class prompt
ALERT = "PdfleetKVTransferSlow"
# Counters of events healthy traffic need not produce: the gateway exports a labelled counter only once
# it counted one, so these rules have no value until then (absent, never a made-up zero).
EVENT_RULES = {
    "pool_class:gateway_errors:rate",
    "pool:gateway_stream_errors:rate",
    "reason:gateway_fallbacks:rate",
    "fleet:gateway_fallback:ratio",
    "pool_class:gateway_stream_stalls:per_min",
}


def _invoke(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*INVOKE, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )


def _provision(profile: str, report: Path, *extra: str) -> dict:  # type: ignore[type-arg]
    proc = _invoke("provision", "--profile", profile, "--json", str(report), *extra)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return dict(json.loads(report.read_text()))


def _wait(check: Callable[[], bool], timeout: float, what: str, every: float = 2) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(every)
    raise AssertionError(f"{what} did not happen within {timeout:g} s")


def _gw(lab: LabHandle):  # noqa: ANN202 - LabHost
    return next(h for h in lab.hosts if h.name == "lab-gw")


@pytest.fixture(scope="session")
def lab_cross_once(lab: LabHandle, tmp_path_factory: pytest.TempPathFactory) -> None:
    """lab-cross provisioned once a session, not once a module: the suite runs this file's state tests
    among the first and its KV-alert test after them (conftest STATES), and a module fixture provisioned
    again for that one test (5.6 s in CI), on a fleet every module leaves on lab-cross (what the SWITCHING
    modules owe is paid before: conftest PAYS_LAB_CROSS, lab_cross_back)."""
    _provision(PROFILE, tmp_path_factory.mktemp("mon") / "first.json")


@pytest.fixture
def provisioned(lab_cross_once: None) -> dict[str, str]:
    """lab-cross provisioned; the client environment `invoke lab.env` prints."""
    return lab_env()


@pytest.fixture
def prom(provisioned: dict[str, str]) -> PrometheusClient:
    client = PrometheusClient(PROMETHEUS_URL)
    _wait(client.ready, 120, "Prometheus on lab-gw answering")
    return client


class Traffic:
    """Streamed chat requests through the gateway to both pools, short and long, in two threads.

    A provision that restarts the simulators (a changed --sim-link) ends the streams in flight; errors
    seen while `restarting()` are expected and only counted, any other error fails the test.
    """

    def __init__(self) -> None:
        self.client = openai.OpenAI(max_retries=0, timeout=120)
        self.stop = threading.Event()
        self._restarting = threading.Event()
        self.errors: list[BaseException] = []
        self.expected_errors = 0
        self.served_from: dict[str, float] = {}  # per pool: when its last answered request started

    def one(self, pool: str, prompt: str) -> None:
        stream = self.client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=16,
            stream=True,
            extra_headers={POOL_HEADER: pool},
        )
        for _ in stream:
            pass

    def loop(self, pool: str) -> None:
        # each long prompt its own first word: a decode instance caches the KV it pulled (as vLLM does), so
        # a repeated prompt would move no KV after its first request and the KV-transfer series would stop
        for n in itertools.count():
            if self.stop.is_set():
                return
            try:
                for prompt in ("hello, how are you?", f"{pool}{n} {LONG_PROMPT}"):
                    started = time.monotonic()
                    self.one(pool, prompt)
                    self.served_from[pool] = started
            except BaseException as exc:  # noqa: BLE001 - reported by the test, not lost in a thread
                if not self._restarting.is_set():
                    self.errors.append(exc)
                    return
                self.expected_errors += 1
                time.sleep(0.5)

    @contextlib.contextmanager
    def restarting(self) -> Iterator[None]:
        """Errors from streams cut by a restart are expected inside, and until each pool's loop has answered
        a request started after it (one loop a pool, one request at a time: none started before is still in
        flight); at most 30 s. It slept a fixed 5 s before."""
        self._restarting.set()
        try:
            yield
            after = time.monotonic()
            _wait(
                lambda: all(self.served_from.get(p, 0.0) >= after for p in ("colocated", "disagg")),
                30,
                "each pool answering after the restart",
                every=0.2,
            )
        finally:
            self._restarting.clear()


@pytest.fixture
def traffic(provisioned: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Traffic]:
    """Traffic running until the test ends; no error outside a restart."""
    for key, value in provisioned.items():
        monkeypatch.setenv(key, value)
    load = Traffic()
    threads = [
        threading.Thread(target=load.loop, args=(pool,), daemon=True) for pool in ("colocated", "disagg")
    ]
    for t in threads:
        t.start()
    yield load
    load.stop.set()
    for t in threads:
        t.join(180)
    assert not load.errors, load.errors


def _deployment(profile: str = PROFILE):  # noqa: ANN202 - Deployment
    return lab_deployment(profile, REGISTRY)


def test_every_target_is_up(prom: PrometheusClient) -> None:
    topology = _deployment().topology
    wanted = {(e.job, e.host) for e in topology.metrics_endpoints} | {("prometheus", "lab-gw")}

    def all_up() -> bool:
        targets = prom.targets()
        seen = {(t["labels"]["job"], t["labels"]["host"]) for t in targets}
        return seen == wanted and all(t["health"] == "up" for t in targets)

    _wait(all_up, 120, "every scrape target up")
    for target in prom.targets():
        labels = target["labels"]
        assert labels["instance"].startswith(labels["host"] + ":")
        if labels["job"] in ("vllm", "vllm-router"):
            assert labels["pool"] in ("colocated", "disagg") and labels["role"]


def _rules_missing_a_pool(prom: PrometheusClient, names: list[str]) -> dict[str, object]:
    """Each recording rule without a value for every pool it should have one for (event rules: only
    that their pools are known), with the pools it has."""
    missing: dict[str, object] = {}
    for name in names:
        found = prom.instant(name)
        pools = {s.labels.get("pool") for s in found if not math.isnan(s.value)}
        if name in EVENT_RULES:
            assert pools <= {"colocated", "disagg", None}, (name, pools)
            continue
        if "pool" not in name.split(":")[0].split("_"):  # the rule's level names its labels (fleet:, reason:)
            expected: set[str | None] = {None}
        elif "kv_transfer" in name or "nixl" in name:
            expected = {"disagg"}  # only the P/D pool moves KV
        else:
            expected = {"colocated", "disagg"}
        if not expected <= pools:
            missing[name] = sorted(str(p) for p in pools)
    return missing


def test_each_recording_rule_has_a_value_per_pool_after_streamed_traffic(
    prom: PrometheusClient, traffic: Traffic
) -> None:
    """Polled until every rule has its pools (the traffic needs a few evaluations in the rules' window),
    at most 3 evaluations past the window plus 40 s."""
    deployment = _deployment()
    steps = chain_steps(deployment.profile, True)
    figures = chain_figures(deployment.profile, True)
    names = [s.recorded(q) for s in steps for q in (0.5, 0.95, 0.99)] + [f.name for f in figures]
    monitoring = deployment.profile.monitoring
    bound = 3 * monitoring.evaluation_interval_s + monitoring.rule_window_s + 40
    deadline = time.monotonic() + bound
    while (missing := _rules_missing_a_pool(prom, names)) and time.monotonic() < deadline:
        time.sleep(2)
    assert not missing, missing


def test_second_provision_changes_nothing_and_a_changed_rule_file_reloads(
    lab: LabHandle, prom: PrometheusClient, tmp_path: Path
) -> None:
    assert _provision(PROFILE, tmp_path / "again.json")["totals"]["changed"] == 0
    gw = _gw(lab)
    rc, pid_before, err = lab.ssh(gw, "systemctl show -p MainPID --value prometheus.service")
    assert rc == 0, err
    reloads = _last_reload(prom)
    rc, _, err = lab.ssh(gw, "echo '# drift' | sudo tee -a /etc/prometheus/pdfleet/alerts.yml >/dev/null")
    assert rc == 0, err
    data = _provision(PROFILE, tmp_path / "drift.json", "--roles", "monitoring")
    assert data["hosts"]["lab-gw"]["changed"] == 1, data["hosts"]["lab-gw"]
    rc, pid_after, _ = lab.ssh(gw, "systemctl show -p MainPID --value prometheus.service")
    assert pid_after.strip() == pid_before.strip(), "Prometheus was restarted, not reloaded"
    deadline = time.monotonic() + 30
    while _last_reload(prom) <= reloads and time.monotonic() < deadline:
        time.sleep(2)
    if _last_reload(prom) <= reloads:  # what Prometheus and its journal said, for the next reader
        series = prom.instant('{__name__=~"prometheus_config_last_reload.*"}')
        journal = lab.ssh(gw, "sudo journalctl -u prometheus.service -n 15 --no-pager")[1]
        raise AssertionError(f"no successful reload within 30 s after {reloads}: {series}\n{journal}")
    assert prom.instant("min(prometheus_config_last_reload_successful)")[0].value == 1


def _last_reload(prom: PrometheusClient) -> float:
    """Prometheus's newest successful config reload: the max over its series, as a Prometheus restarted by an
    earlier test may still show its previous self-scrape series (no staleness marker) within the lookback."""
    return prom.instant("max(prometheus_config_last_reload_success_timestamp_seconds)")[0].value


def _alert_state(prom: PrometheusClient) -> set[str]:
    return {a["state"] for a in prom.alerts() if a["labels"].get("alertname") == ALERT}


def test_slow_kv_link_fires_the_kv_transfer_alert_and_restoring_resolves_it(
    prom: PrometheusClient, traffic: Traffic, tmp_path: Path
) -> None:
    # the simulator's --sim-link: KV over plain TCP (≈4 GB/s) instead of 400G RoCE
    slow_kv = "extends: lab-cross\nvllm:\n  sim:\n    link: tcp\n"
    slow = derived_profile(tmp_path, "lab-cross-slow-kv", slow_kv)
    # only the P/D hosts' simulators move KV: the colocated ones keep serving (and are not restarted)
    pd_services = ("--roles", "services", "--limit", "prefill,decode")
    try:
        with traffic.restarting():
            _provision(slow, tmp_path / "slow.json", *pd_services)
        _wait(lambda: _alert_state(prom) == {"firing"}, 120, f"{ALERT} firing on the slow link")
        (alert,) = [a for a in prom.alerts() if a["labels"]["alertname"] == ALERT]
        assert "transport is the bottleneck" in alert["annotations"]["summary"]
    finally:
        with traffic.restarting():
            _provision(PROFILE, tmp_path / "restore.json", *pd_services)
    _wait(lambda: not _alert_state(prom), 120, f"{ALERT} resolved after the link was restored")


def _monitor_once() -> subprocess.CompletedProcess[str]:
    """`invoke monitor` once, over the last 5 minutes."""
    proc = _invoke("monitor", "--profile", PROFILE, "--minutes", "5", timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc


def _every_ttft_cell_filled(stdout: str) -> bool:
    """Whether the gateway's TTFT rows hold every pool and class with six figures each."""
    rows = _chain_rows(stdout, "TTFT at the gateway")
    classes = {(pool, cls) for pool, cls, cells in rows if len(cells) == 6 and None not in cells}
    return classes >= {(pool, cls) for pool in ("colocated", "disagg") for cls in ("short", "long")}


def test_invoke_monitor_shows_the_chain(prom: PrometheusClient, traffic: Traffic) -> None:
    """Asked again until the streamed traffic fills the chain's TTFT rows (within 60 s), then read."""
    deadline = time.monotonic() + 60
    proc = _monitor_once()
    while not _every_ttft_cell_filled(proc.stdout) and time.monotonic() < deadline:
        time.sleep(3)
        proc = _monitor_once()
    assert f" — {PROMETHEUS_URL} — " in proc.stdout.splitlines()[0], proc.stdout  # the profile's port
    rows = _chain_rows(proc.stdout, "TTFT at the gateway")
    assert {(pool, cls) for pool, cls, _ in rows} >= {
        (pool, cls) for pool in ("colocated", "disagg") for cls in ("short", "long")
    }, proc.stdout
    for pool, cls, cells in rows:
        # P50, P95, P99 over the rules' window, then over --minutes: each a figure, in order
        assert len(cells) == 6 and None not in cells, (pool, cls, proc.stdout)
        now, window = cells[:3], cells[3:]
        assert now == sorted(now) and window == sorted(window), (pool, cls, cells)
    # vLLM's request-time histograms start at 0.3 s: under it a quantile is only "<300 ms", never the
    # interpolated 150/285/297 ms the table printed before (issue 26)
    for title in ("queue time (WAITING)", "prefill time", "decode time"):
        for pool, role, cells in _chain_rows(proc.stdout, title):
            assert all(c is None or c >= 0.3 for c in cells), (title, pool, role, proc.stdout)
    assert "<300 ms" in proc.stdout, proc.stdout


CELL = re.compile(r"(\d+(?:\.\d+)?) (ms|s)|no data")


def _chain_rows(table: str, title: str) -> list[tuple[str, str, list[float | None]]]:
    """The rows of one step of `invoke monitor`'s chain table: pool, class or role, and each quantile
    cell in seconds (None: "no data")."""
    out = []
    for line in table.splitlines():
        if not line.startswith(title):
            continue
        pool, group, rest = line[len(title) :].split(maxsplit=2)
        cells = [
            None if m.group(0) == "no data" else float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)
            for m in CELL.finditer(rest)
        ]
        out.append((pool, group, cells))
    return out


# ---- issue 28: host metrics and Alertmanager -------------------------------------------------------------
# The host rows' panels that have data in the lab: its containers have no RDMA devices (no
# /sys/class/infiniband), and their root filesystem is an overlay, which the node exporter leaves out by
# default (only their /tmp tmpfs is reported, and the panel leaves memory filesystems out): the RDMA port
# and filesystem panels are the ones left out (the filesystem collector's series are checked instead).
LAB_HOST_PANELS = (
    "CPU busy per host",
    "Memory in use per host",
    "Disk busy (time doing I/O)",
    "Network received per device (the RDMA netdev among them)",
    "Network sent per device (the RDMA netdev among them)",
)


def test_node_exporters_are_up_on_every_host_and_the_host_rows_have_data(prom: PrometheusClient) -> None:
    deployment = _deployment()
    hosts = {h.name for h in deployment.inventory.hosts.values()}

    def every_node_up() -> bool:
        return {s.labels["host"] for s in prom.instant('up{job="node"} == 1')} == hosts

    _wait(every_node_up, 60, "every host's node exporter up")
    assert {s.labels["host"] for s in prom.instant('node_filesystem_size_bytes{job="node"}')} == hosts
    window = deployment.profile.monitoring.rule_window_s
    rows = dict(host_rows(deployment.profile))
    panels = {p.title: p for row in rows.values() for p in row}
    # the rates need two scrapes in their window: poll until every panel has every host
    missing: dict[str, set[str]] = {}
    deadline = time.monotonic() + window + 30
    while True:
        missing = {}
        for title in LAB_HOST_PANELS:
            seen = {s.labels.get("host") for q in panels[title].queries for s in prom.instant(q.expr)}
            if hosts - seen:
                missing[title] = hosts - seen
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert not missing, missing


def _notifications(url: str) -> list[dict]:  # type: ignore[type-arg]
    with urllib.request.urlopen(f"{url}/alerts", timeout=10) as resp:
        return list(json.loads(resp.read()))


def _pool_down(url: str, status: str, since: float) -> float | None:
    """When the recorder got a PdfleetPoolDown notification of the decode role with this status (its
    clock: the lab's containers share this machine's), at or after `since`; None: not yet."""
    for note in _notifications(url):
        if note["received"] < since:
            continue
        for alert in note["alerts"]:
            labels = alert["labels"]
            ours = labels.get("alertname") == "PdfleetPoolDown" and labels.get("role") == "decode"
            if ours and alert["status"] == status:
                return float(note["received"])
    return None


def test_stopping_the_decode_service_fires_pool_down_through_alertmanager_and_resolves(
    lab: LabHandle, prom: PrometheusClient
) -> None:
    """The decode unit stopped: PdfleetPoolDown reaches the lab's recorder through Alertmanager within the
    rule's `for` plus one evaluation interval, plus the scrape that sees the target down and Alertmanager's
    group_wait (3 s of margin for a busy machine); the decode target's own PdfleetTargetDown is held back
    (inhibited), never notified. Started again, the resolved notification follows."""
    deployment = _deployment()
    mon = deployment.profile.monitoring
    server = deployment.topology.prometheus
    assert server is not None and server.alertmanager is not None
    url = server.alertmanager.recorder_url
    assert url is not None, "lab-cross asks for the lab recorder"
    (decode,) = deployment.topology.pool("decode")
    host = next(h for h in lab.hosts if h.name == decode.host)
    bound = mon.alert_for_s + mon.evaluation_interval_s + mon.scrape_interval_s
    bound += mon.alertmanager.group_wait_s + 3
    stopped = time.time()
    rc, _, err = lab.ssh(host, f"sudo systemctl stop {decode.unit}")
    assert rc == 0, err
    try:
        _wait(lambda: _pool_down(url, "firing", stopped) is not None, bound + 30, "PdfleetPoolDown notified")
        fired = _pool_down(url, "firing", stopped)
        assert fired is not None and fired - stopped <= bound, (fired - stopped, bound)
        print(f"PdfleetPoolDown notified {fired - stopped:.1f} s after the stop (bound {bound} s)")
        held = [
            a
            for n in _notifications(url)
            if n["received"] >= stopped
            for a in n["alerts"]
            if a["labels"].get("alertname") == "PdfleetTargetDown" and a["labels"].get("host") == decode.host
        ]
        assert not held, held
    finally:
        rc, _, err = lab.ssh(host, f"sudo systemctl start {decode.unit}")
        assert rc == 0, err
    started = time.time()
    _wait(lambda: _pool_down(url, "resolved", started) is not None, bound + 30, "PdfleetPoolDown resolved")
    print(f"resolved {(_pool_down(url, 'resolved', started) or started) - started:.1f} s after the start")
    monitor = _invoke("monitor", "--profile", PROFILE, "--minutes", "1", timeout=120)
    assert monitor.returncode == 0 and "Alerts firing (Alertmanager " in monitor.stdout, monitor.stderr

"""alertmanager.yml: amtool accepts it for every profile and inventory that deploy together, routes send
each severity and pool where the profile says (amtool's routing test), secrets are named by file, and a
real Alertmanager on loopback holds a pool's other alerts back while the pool is down, notifying the
lab's recorder of the rest."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdfleet.bench.procs import free_port, wait_http
from pdfleet.fleet.topology import Alertmanager
from pdfleet.model.alerting import LAB_RECEIVER, AlertmanagerSpec
from pdfleet.model.profile import Profile
from pdfleet.monitoring.alertmanager_config import (
    NOWHERE,
    POOL_DOWN,
    alertmanager_args,
    alertmanager_config,
    secret_file,
    secret_files,
)
from pdfleet.monitoring.notification_recorder import Recorder, serve
from tests.unit.fleet.helpers import fleet_of, profile_inventory_pairs

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py

AMTOOL = "/usr/bin/amtool"
ALERTMANAGER = "/usr/bin/prometheus-alertmanager"
PAIRS = [(p, i) for p, i in profile_inventory_pairs() if "monitoring" in i.read_text()]
RECEIVERS = {
    "receivers": [
        {
            "name": "ops",
            "webhook": {"url": "https://hooks.example.org/am", "bearer_token": {"env": "AM_TOKEN"}},
        },
        {"name": "pager", "slack": {"api_url": {"file": "/etc/pdfleet/slack.url"}, "channel": "#pager"}},
        {
            "name": "mail",
            "email": {
                "to": "oncall@example.org",
                "sender": "alertmanager@example.org",
                "smarthost": "smtp.example.org:587",
                "username": "am",
                "password": {"env": "SMTP_PASSWORD"},
            },
        },
    ],
    "routes": [
        {"receiver": "pager", "severity": "critical", "pool": "disagg"},
        {"receiver": "mail", "severity": "warning"},
    ],
}


def need_alertmanager() -> None:
    if not (shutil.which(AMTOOL) and shutil.which(ALERTMANAGER)):
        pytest.skip("amtool/alertmanager not installed (./dev setup installs prometheus-alertmanager)")


def _amtool(*args: str) -> subprocess.CompletedProcess[str]:
    need_alertmanager()
    return subprocess.run([AMTOOL, *args], capture_output=True, text=True, timeout=60, check=False)


def _with(profile: Profile, **alertmanager: Any) -> Profile:
    spec = AlertmanagerSpec.model_validate({**profile.monitoring.alertmanager.model_dump(), **alertmanager})
    return profile.model_copy(
        update={"monitoring": profile.monitoring.model_copy(update={"alertmanager": spec})}
    )


@pytest.mark.parametrize(("profile", "inventory"), PAIRS, ids=lambda v: v if isinstance(v, str) else v.name)
def test_every_rendered_config_passes_amtool(profile: str, inventory: Path, tmp_path: Path) -> None:
    fleet = fleet_of(profile, inventory)
    for server in fleet.topology.monitoring:
        assert server.alertmanager is not None
        path = tmp_path / f"{server.host}.yml"
        path.write_text(alertmanager_config(fleet.profile, server.alertmanager))
        checked = _amtool("check-config", str(path))
        assert checked.returncode == 0 and "SUCCESS" in checked.stdout, checked.stdout + checked.stderr


def _routed(config: Path, *labels: str) -> str:
    proc = _amtool("config", "routes", "test", f"--config.file={config}", *labels)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_routes_by_severity_and_pool_and_the_lab_recorder_sees_everything(tmp_path: Path) -> None:
    lab = fleet_of("lab-cross", Path("inventory/lab.yml").resolve())
    server = lab.topology.monitoring[0]
    assert server.alertmanager is not None and server.alertmanager.recorder_port is not None
    config = tmp_path / "alertmanager.yml"
    config.write_text(alertmanager_config(_with(lab.profile, **RECEIVERS), server.alertmanager))
    assert _amtool("check-config", str(config)).returncode == 0
    assert _routed(config, "severity=critical", "pool=disagg") == f"{LAB_RECEIVER},pager"
    assert _routed(config, "severity=critical", "pool=colocated") == f"{LAB_RECEIVER},ops"
    assert _routed(config, "severity=warning", "pool=disagg") == f"{LAB_RECEIVER},mail"
    assert _routed(config, "alertname=PdfleetFallbacks") == f"{LAB_RECEIVER},ops"  # no route: the default
    bare = tmp_path / "bare.yml"
    bare.write_text(alertmanager_config(lab.profile, Alertmanager("h", "127.0.0.1", 9)))  # no receivers
    assert _routed(bare, "severity=critical") == NOWHERE


def test_secrets_are_named_by_their_files_never_written_into_the_config() -> None:
    lab = fleet_of("lab-cross", Path("inventory/lab.yml").resolve())
    profile = _with(lab.profile, **RECEIVERS)
    server = lab.topology.monitoring[0]
    assert server.alertmanager is not None
    doc = yaml.safe_load(alertmanager_config(profile, server.alertmanager))
    by_name = {r["name"]: r for r in doc["receivers"]}
    assert by_name["pager"]["slack_configs"][0]["api_url_file"] == secret_file("pager-slack-url")
    assert by_name["mail"]["email_configs"][0]["auth_password_file"] == secret_file("mail-smtp-password")
    auth = by_name["ops"]["webhook_configs"][0]["http_config"]["authorization"]
    assert auth == {"type": "Bearer", "credentials_file": secret_file("ops-webhook-token")}
    values = {
        "pager-slack-url": "https://hooks.slack.com/x",
        "mail-smtp-password": "pw",
        "ops-webhook-token": "t",
    }
    written = dict(secret_files(profile, values))
    assert written[secret_file("pager-slack-url")] == "https://hooks.slack.com/x\n"
    with pytest.raises(Exception, match="the secret mail-smtp-password was not read"):
        secret_files(profile, {"pager-slack-url": "x", "ops-webhook-token": "t"})


def test_one_alertmanager_no_cluster_on_the_host_address() -> None:
    args = alertmanager_args(Alertmanager("h", "198.18.0.10", 9095))
    assert "--web.listen-address=198.18.0.10:9095" in args and "--cluster.listen-address=" in args


@pytest.fixture
def recorder() -> Iterator[tuple[Recorder, int]]:
    kept, port = Recorder(), free_port()
    server = serve("127.0.0.1", port, kept)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield kept, port
    server.shutdown()
    server.server_close()


def _alert(name: str, **labels: str) -> dict[str, Any]:
    now = datetime.now(UTC)
    return {
        "labels": {"alertname": name, **labels},
        "annotations": {"summary": name},
        "startsAt": now.isoformat(),
        "endsAt": (now + timedelta(minutes=5)).isoformat(),
    }


def _api(url: str, body: object | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        return json.loads(resp.read() or b"null")


def test_a_real_alertmanager_holds_back_a_down_pool_s_other_alerts(
    tmp_path: Path, recorder: tuple[Recorder, int]
) -> None:
    """Pool down on disagg with a down target and a TTFT alert there, and a TTFT alert on the colocated
    pool: the disagg pool's others are suppressed (inhibited by the pool-down alert), the colocated one
    is not, and the recorder is notified of exactly the unsuppressed ones."""
    need_alertmanager()
    kept, recorder_port = recorder
    lab = fleet_of("lab-cross", Path("inventory/lab.yml").resolve())
    port = free_port()
    am = Alertmanager("h", "127.0.0.1", port, recorder_port)
    config = tmp_path / "alertmanager.yml"
    config.write_text(alertmanager_config(_with(lab.profile, group_wait_s=0, group_interval_s=1), am))
    args = [a for a in alertmanager_args(am) if not a.startswith(("--config.file", "--storage.path"))]
    proc = subprocess.Popen(
        [ALERTMANAGER, f"--config.file={config}", f"--storage.path={tmp_path / 'data'}", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_http(f"{am.url}/-/ready", 30, proc)
        disagg = {"model": "m", "pool": "disagg"}
        alerts = [
            _alert(POOL_DOWN, role="decode", severity="critical", **disagg),
            _alert("PdfleetTargetDown", role="decode", severity="critical", host="d1", job="vllm", **disagg),
            _alert("PdfleetTTFTOverSLO", length_class="long", severity="warning", **disagg),
            _alert(
                "PdfleetTTFTOverSLO", length_class="long", severity="warning", model="m", pool="colocated"
            ),
        ]
        # the pool-down alert first, processed before the others come: with group_wait 0 a loaded machine
        # once flushed the others before the inhibitor had seen their source (Prometheus's group_wait and
        # its alerts' `for` give a fleet that order)
        _api(f"{am.url}/api/v2/alerts", alerts[:1])
        deadline = time.monotonic() + 30
        while not [a for a in _api(f"{am.url}/api/v2/alerts") if a["status"]["state"] == "active"]:
            assert time.monotonic() < deadline, "the pool-down alert was not processed within 30 s"
            time.sleep(0.2)
        _api(f"{am.url}/api/v2/alerts", alerts[1:])
        while True:  # until every alert went through the pipeline (an alert is `unprocessed` before)
            notified = {
                (a["labels"]["alertname"], a["labels"]["pool"]) for n in kept.all() for a in n["alerts"]
            }
            states = {
                (a["labels"]["alertname"], a["labels"]["pool"]): a["status"]
                for a in _api(f"{am.url}/api/v2/alerts")
            }
            settled = len(states) == 4 and all(s["state"] != "unprocessed" for s in states.values())
            if (settled and len(notified) >= 2) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        proc.terminate()
        proc.wait(20)
    assert states[(POOL_DOWN, "disagg")]["state"] == "active"
    assert states[("PdfleetTTFTOverSLO", "colocated")]["state"] == "active"
    for held in ("PdfleetTargetDown", "PdfleetTTFTOverSLO"):
        assert states[(held, "disagg")]["state"] == "suppressed", states
        assert states[(held, "disagg")]["inhibitedBy"], states
    assert notified == {(POOL_DOWN, "disagg"), ("PdfleetTTFTOverSLO", "colocated")}

"""`invoke monitor`'s alerts section, read from a real Alertmanager on loopback: active alerts listed
critical first, inhibited ones counted; an Alertmanager that does not answer is one line."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from pdfleet.bench.procs import free_port, wait_http
from pdfleet.errors import ValidationError
from pdfleet.fleet.topology import Alertmanager
from pdfleet.monitoring.alertmanager_config import alertmanager_config
from pdfleet.monitoring.firing import alertmanager_url, firing_section, read_alerts
from tests.unit.fleet.helpers import REPO, fleet_of

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py

ALERTMANAGER = "/usr/bin/prometheus-alertmanager"


def _post(url: str, alerts: list[dict[str, object]]) -> None:
    request = urllib.request.Request(
        f"{url}/api/v2/alerts", json.dumps(alerts).encode(), headers={"Content-Type": "application/json"}
    )
    urllib.request.urlopen(request, timeout=10).close()


def _alert(name: str, severity: str, **labels: str) -> dict[str, object]:
    now = datetime.now(UTC)
    return {
        "labels": {"alertname": name, "severity": severity, **labels},
        "annotations": {"summary": f"{name} summary"},
        "startsAt": now.isoformat(),
        "endsAt": (now + timedelta(minutes=5)).isoformat(),
    }


def test_active_alerts_listed_critical_first_and_held_back_ones_counted(tmp_path: Path) -> None:
    if shutil.which(ALERTMANAGER) is None:
        pytest.skip("prometheus-alertmanager not installed (./dev setup installs it)")
    lab = fleet_of("lab-colocated", REPO / "inventory/lab.yml")  # no recorder
    am = Alertmanager("h", "127.0.0.1", free_port())
    config = tmp_path / "alertmanager.yml"
    config.write_text(alertmanager_config(lab.profile, am))
    proc = subprocess.Popen(
        [
            ALERTMANAGER,
            f"--config.file={config}",
            f"--storage.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{am.port}",
            "--cluster.listen-address=",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_http(f"{am.url}/-/ready", 30, proc)
        _post(
            am.url,
            [
                _alert("PdfleetStreamStalls", "warning", pool="colocated", length_class="short"),
                _alert("PdfleetPoolDown", "critical", model="m", pool="disagg", role="decode"),
                _alert("PdfleetTargetDown", "critical", model="m", pool="disagg", role="decode", host="d1"),
            ],
        )
        deadline = time.monotonic() + 30
        while any(a.state == "unprocessed" for a in read_alerts(am.url)) and time.monotonic() < deadline:
            time.sleep(0.5)
        text = firing_section(am.url)
    finally:
        proc.terminate()
        proc.wait(20)
    lines = text.splitlines()
    held = "1 held back (inhibited while their pool is down, or silenced)"
    assert lines[0] == f"Alerts firing (Alertmanager {am.url}): 2; {held}", text
    assert "critical PdfleetPoolDown  model=m pool=disagg role=decode  since" in lines[1], text
    assert lines[2].strip() == "PdfleetPoolDown summary"
    assert "warning  PdfleetStreamStalls  pool=colocated length_class=short" in lines[3], text
    assert "PdfleetTargetDown" not in text


def test_no_answer_is_one_line_and_a_bad_url_is_refused() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert firing_section(url).startswith(f"Alerts: Alertmanager at {url} does not answer (")
    assert firing_section(None) == "Alerts: the inventory has no monitoring host (no Alertmanager)\n"
    lab = fleet_of("lab-cross", REPO / "inventory/lab.yml")
    assert alertmanager_url(lab.topology, None) == "http://198.18.0.10:9095"
    with pytest.raises(ValidationError, match="--alertmanager: 'lab-gw:9095' is not an http"):
        alertmanager_url(lab.topology, "lab-gw:9095")

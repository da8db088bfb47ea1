"""`invoke provision` against the lab: converges, then a second run changes nothing; pools really serve."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pdfleet.inventory import load_inventory
from pdfleet.lab.mirrors import refresh_pdfleet_wheel
from pdfleet.pools import host_instances
from pdfleet.profile import load_profile

from .conftest import REPO_ROOT, LabHandle

INVOKE = [sys.executable, "-m", "invoke"]


def _provision(profile: str, inventory: Path, report: Path) -> dict:
    """Run the real CLI (as an operator would) and return its JSON report."""
    proc = subprocess.run([*INVOKE, "provision", "--profile", profile, "--inventory", str(inventory),
                           "--json", str(report)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert report.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(report.read_text())
    assert proc.returncode == 0, json.dumps({h: v.get("error") for h, v in data["hosts"].items()}, indent=1)
    return data


@pytest.mark.parametrize("profile", ["lab-cross"])
def test_provision_twice_second_run_changes_nothing(lab: LabHandle, tmp_path: Path, profile: str) -> None:
    inventory = lab.lab.inventory
    # The hosts install the pdfleet of this clone; serve its wheel before provisioning.
    refresh_pdfleet_wheel(lab.paths, REPO_ROOT)
    first = _provision(profile, inventory, tmp_path / "first.json")
    assert first["totals"]["failed"] == 0
    assert first["totals"]["ok"] + first["totals"]["changed"] > 0
    second = _provision(profile, inventory, tmp_path / "second.json")
    assert second["totals"]["failed"] == 0
    assert second["totals"]["changed"] == 0, {h: v["changes"] for h, v in second["hosts"].items()}

    prof = load_profile(profile, REPO_ROOT / "profiles")
    inv = load_inventory(inventory)
    served = 0
    for lab_host in lab.hosts:
        for instance in host_instances(prof, inv.hosts[lab_host.name]):
            check = (f"systemctl is-active {instance.unit} && "
                     f"curl -fsS -o /dev/null -w '%{{http_code}}' {instance.health_url}")
            rc, out, err = lab.ssh(lab_host, check)
            assert rc == 0, f"{lab_host.name} {instance.unit}: {out} {err}"
            assert out.strip().endswith("200")
            served += 1
    assert served >= 2, "lab-cross runs a prefill and a decode pool"

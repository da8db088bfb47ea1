"""`invoke verify` against the provisioned lab: service checks pass, hardware checks skip with reasons,
and a stopped unit or a world-readable env file makes verify fail naming the host and the check."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from pdfleet.lab.mirrors import refresh_host_wheel
from tests.lab.helpers import REPO_ROOT, LabHandle

INVOKE = [sys.executable, "-m", "invoke"]
PROFILE = "lab-cross"


def _invoke(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*INVOKE, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)


def _verify(inventory: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return _invoke("verify", "--profile", PROFILE, "--inventory", str(inventory), *extra)


def _junit(path: Path) -> dict[str, tuple[str, str]]:
    """testcase name → (outcome, message) from pytest's JUnit XML."""
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name", "")
        skipped, failure = case.find("skipped"), case.find("failure")
        if failure is not None:
            out[name] = ("fail", failure.get("message", ""))
        elif skipped is not None:
            out[name] = ("skip", skipped.get("message", ""))
        else:
            out[name] = ("pass", "")
    return out


def _host(lab: LabHandle, name: str):  # type: ignore[no-untyped-def]
    return next(h for h in lab.hosts if h.name == name)


def test_verify_lab_passes_then_fails_naming_host_and_check(lab: LabHandle, tmp_path: Path) -> None:
    inventory = lab.lab.inventory
    refresh_host_wheel(lab.paths)
    prov = _invoke("provision", "--profile", PROFILE, "--inventory", str(inventory))
    assert prov.returncode == 0, prov.stdout[-3000:] + prov.stderr[-3000:]

    junit = tmp_path / "verify.xml"
    ok = _verify(inventory, "--junit", str(junit))
    assert ok.returncode == 0, ok.stdout[-4000:] + ok.stderr[-2000:]
    cases = _junit(junit)
    assert not [name for name, (outcome, _) in cases.items() if outcome == "fail"]
    for host in ("lab-p1", "lab-d1"):
        for check in (
            "units_installed_enabled_active",
            "ports_listening",
            "health_answers",
            "env_files_mode_0600",
            "no_key_in_units_or_cmdline",
        ):
            assert cases[f"test_{check}[{host}]"][0] == "pass", (host, check, cases[f"test_{check}[{host}]"])
    for host in ("lab-p1", "lab-d1"):
        assert cases[f"test_kv_env_file[{host}]"][0] == "pass"
        assert cases[f"test_driver_version_matches_pin[{host}]"] == (
            "skip",
            "no NVIDIA GPU on the PCI bus (engine: sim)",
        )
        # lab-cross leaves kv_transfer.sim_library off (the kv-path test turns it on: docs/kv-path.md)
        assert cases[f"test_kv_library_importable[{host}]"][0] == "skip"
        assert "rdma.enabled: false" in cases[f"test_mtu[{host}]"][1]

    p1, d1 = _host(lab, "lab-p1"), _host(lab, "lab-d1")
    try:
        rc, out, err = lab.ssh(p1, "sudo systemctl stop vllm-prefill.service")
        assert rc == 0, err
        rc, out, err = lab.ssh(d1, "sudo chmod 0644 /etc/pdfleet/vllm-decode.env")
        assert rc == 0, err
        # one services verify of the two hosts finds both faults, each named with its host and check (the
        # whole fleet's services passed above)
        faulty = _verify(inventory, "--checks", "services", "--limit", "lab-p1,lab-d1")
        text = " ".join(faulty.stdout.split())
        assert faulty.returncode != 0
        assert "FAIL lab-p1 services/units_installed_enabled_active" in text, text[-3000:]
        assert "FAIL lab-d1 services/env_files_mode_0600" in text, text[-3000:]
        assert "/etc/pdfleet/vllm-decode.env 644 root" in text
    finally:
        # provision repairs both: the unit is started again and the env file back to 0600 (the two hosts
        # only: the others were not touched)
        again = _invoke(
            "provision", "--profile", PROFILE, "--inventory", str(inventory), "--limit", "lab-p1,lab-d1"
        )
    assert again.returncode == 0, again.stdout[-3000:]
    assert _verify(inventory, "--checks", "services", "--limit", "lab-p1,lab-d1").returncode == 0

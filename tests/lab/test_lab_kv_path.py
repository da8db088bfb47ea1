"""`invoke verify --kv-path` on lab-cross (issue 29): NIXL's CPU build (kv_transfer.sim_library) moves 64 MiB
lab-p1 -> lab-d1 over the bridge and the pair reports a throughput; with UCX's data ports on lab-p1 blocked
from lab-d1, the check fails within 15 s naming the ports and the fix. States, not latencies: the throughput
is only required to be there. On lab-cross as provisioned, with the library turned on in a profile extending
it (lab-cross leaves it off: its install would cost every from-scratch provision) and installed by its
kv_transfer role on the P/D hosts; it stays installed (lab-cross's provision removes nothing)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from tests.lab.helpers import REPO_ROOT, LabHandle

PROFILE = "lab-cross"
CHECK = "test_kv_path[lab-p1->lab-d1]"
DATA_PORTS = "20100-20199"  # lab-cross's kv_transfer.ucx_tcp_port_range


def _with_library(tmp_path: Path) -> str:
    """lab-cross with kv_transfer.sim_library on, beside a copy of the repo's profiles."""
    profiles = tmp_path / "profiles"
    shutil.copytree(REPO_ROOT / "profiles", profiles)
    (profiles / "lab-cross-nixl.yml").write_text(f"extends: {PROFILE}\nkv_transfer:\n  sim_library: true\n")
    return str(profiles / "lab-cross-nixl.yml")


def _install(profile: str, inventory: Path) -> None:
    """The kv_transfer role on the P/D hosts: NIXL's CPU build and numpy into the simulator's venv."""
    args = ["provision", "--profile", profile, "--inventory", str(inventory), "--roles", "kv_transfer"]
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", *args, "--limit", "prefill,decode"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _verify(profile: str, inventory: Path, junit: Path) -> subprocess.CompletedProcess[str]:
    args = ["verify", "--profile", profile, "--inventory", str(inventory), "--kv-path", "--checks", "kv_path"]
    cmd = [sys.executable, "-m", "invoke", *args, "--junit", str(junit)]
    return subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)


def _case(junit: Path) -> tuple[str, str, float]:
    """(outcome, failure message or the pass's note, seconds) of the pair's check in pytest's JUnit XML."""
    case = next(c for c in ET.parse(junit).getroot().iter("testcase") if c.get("name") == CHECK)
    failure = case.find("failure")
    if failure is not None:
        return "fail", failure.get("message", ""), float(case.get("time", "0"))
    note = next((p.get("value", "") for p in case.iter("property") if p.get("name") == "note"), "")
    return "pass", note, float(case.get("time", "0"))


def _block_commands(lab: LabHandle, prefill_address: str) -> tuple[str, str]:
    """(block, unblock) of TCP from lab-d1 to lab-p1's UCX data ports: nft's drop when lab-d1 has it (the
    SYN goes unanswered: UCX_TCP_SYN_CNT bounds the wait), else a policy-routing rule (refused at once)."""
    d1 = next(h for h in lab.hosts if h.name == "lab-d1")
    rc, _, _ = lab.ssh(d1, "command -v nft")
    if rc == 0:
        table = "inet pdfleet_kv_path_test"
        return (
            f"sudo nft add table {table} && sudo nft add chain {table} out "
            f"'{{ type filter hook output priority 0 ; }}' && sudo nft add rule {table} out "
            f"ip daddr {prefill_address} tcp dport {DATA_PORTS} drop",
            f"sudo nft delete table {table}",
        )
    # numeric: the lab image has no /etc/protocols, so iproute2 does not know "tcp"
    rule = f"priority 91 to {prefill_address} ipproto 6 dport {DATA_PORTS} prohibit"
    return f"sudo ip rule add {rule}", f"sudo ip rule del {rule}"


def test_verify_kv_path_moves_bytes_then_fails_naming_a_blocked_data_port(
    lab: LabHandle, tmp_path: Path
) -> None:
    inventory = lab.lab.inventory
    profile = _with_library(tmp_path)
    _install(profile, inventory)
    ok = _verify(profile, inventory, tmp_path / "ok.xml")
    outcome, note, _ = _case(tmp_path / "ok.xml")
    assert ok.returncode == 0 and outcome == "pass", ok.stdout[-3000:] + ok.stderr[-2000:]
    assert note.startswith("lab-p1->lab-d1: 64 MiB in ") and "Gb/s, setup " in note and "over tcp" in note, (
        note
    )

    p1 = next(h for h in lab.hosts if h.name == "lab-p1")
    d1 = next(h for h in lab.hosts if h.name == "lab-d1")
    block, unblock = _block_commands(lab, p1.address)
    rc, out, err = lab.ssh(d1, block)
    assert rc == 0, out + err
    try:
        blocked = _verify(profile, inventory, tmp_path / "blocked.xml")
    finally:
        lab.ssh(d1, unblock)
    outcome, message, seconds = _case(tmp_path / "blocked.xml")
    assert blocked.returncode == 1 and outcome == "fail", blocked.stdout[-3000:] + blocked.stderr[-2000:]
    assert f"UCX could not connect to lab-p1's UCX data ports {DATA_PORTS}" in message, message
    assert f"fix: allow TCP {DATA_PORTS} from lab-d1 to lab-p1" in message, message
    assert seconds < 15, f"the blocked pair took {seconds:.1f} s to fail"

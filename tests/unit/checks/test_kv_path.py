"""`verify --kv-path`'s pure half: the probe's two commands and the verdict on what each side printed (the
stage it stopped at names the port and the fix), and a real run of the probe program over SSH on loopback
into a venv without NIXL (the library's absence is the finding)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from pdfleet.checks.kv_path import (
    FETCH_TIMEOUT_S,
    PROBE_FILE,
    TIMED_OUT,
    PathFacts,
    ProbeSide,
    fetch_command,
    parse_side,
    serve_command,
    split_message,
    verdict,
)
from pdfleet.checks.verify import FAIL, VerifyOptions, kv_pairs, run_verify
from pdfleet.fleet.topology import build_topology
from pdfleet.model.inventory import load_inventory
from tests.unit.hw.helpers import REPO, profile

pytestmark = pytest.mark.procs  # the probe program runs in a process of its own

PROBE = (REPO / "templates" / PROBE_FILE).read_text()
FACTS = PathFacts("lab-p1", "lab-d1", "198.18.0.11", 5599, "20100-20199", None, "tcp")
OK = {"ok": True, "role": "fetch", "bytes": 64 << 20, "setup_s": 0.05, "seconds": 0.5}


def _side(stages: list[str], result: dict[str, object] | None, rc: int = 0) -> str:
    lines = [f"stage {s}" for s in stages] + ["2026-12-03 07:33:53 NIXL INFO    _api.py:405 Backend UCX"]
    return "\n".join(lines + ([json.dumps(result)] if result is not None else []))


def test_a_moved_buffer_passes_with_throughput_and_setup_time() -> None:
    found = verdict(
        FACTS,
        parse_side(_side(["wait_notification"], {"ok": True}), 0),
        parse_side(_side(["side_channel", "register", "connect", "transfer", "verify"], OK), 0),
    )
    assert found.ok and found.gbps == pytest.approx((64 << 20) * 8 / 0.5 / 1e9)
    assert found.setup_ms == pytest.approx(50)
    assert "lab-p1->lab-d1: 64 MiB in 500 ms = 1.07 Gb/s, setup 50 ms over tcp" in found.summary


def test_far_below_the_rdma_floor_fails_naming_tcp_instead_of_rc() -> None:
    rdma = PathFacts("p", "d", "10.0.0.1", 5599, None, 200.0, "rdma")
    found = verdict(rdma, parse_side("", 0), parse_side(_side(["verify"], OK), 0))
    assert not found.ok and "far below rdma.min_bandwidth_gbps 200.0" in found.summary
    assert "TCP instead of RC" in found.fix and "UCX_IB_GID_INDEX" in found.fix
    assert verdict(rdma, parse_side("", 0), parse_side(_side(["verify"], {**OK, "seconds": 0.002}), 0)).ok


def test_a_decode_side_killed_while_connecting_names_the_data_ports_and_the_fix() -> None:
    fetch = parse_side(_side(["side_channel", "register", "connect"], None), TIMED_OUT)
    found = verdict(FACTS, parse_side(_side(["wait_notification"], None), 0), fetch)
    assert not found.ok and "UCX data ports 20100-20199" in found.summary
    assert f"no answer within {FETCH_TIMEOUT_S} s" in found.summary
    assert found.fix.startswith("allow TCP 20100-20199 from lab-d1 to lab-p1")
    unpinned = PathFacts("lab-p1", "lab-d1", "198.18.0.11", 5599, None, None, "tcp")
    assert "kv_transfer.ucx_tcp_port_range" in verdict(unpinned, parse_side("", 0), fetch).fix


def test_an_unreachable_side_channel_names_the_probe_port() -> None:
    error = {"ok": False, "role": "fetch", "error": "ConnectionRefusedError: [Errno 111] Connection refused"}
    found = verdict(FACTS, parse_side("", 0), parse_side(_side(["side_channel"], error), 1))
    assert not found.ok and "side channel 198.18.0.11:5599 is unreachable" in found.summary
    assert "Connection refused" in found.summary and found.fix.startswith(
        "allow TCP 5599 from lab-d1 to lab-p1"
    )


def test_a_stalled_transfer_and_a_missing_library_say_what_to_change() -> None:
    stalled = {"ok": False, "role": "fetch", "error": "transfer state ERR after 10.0 s"}
    found = verdict(FACTS, parse_side("", 0), parse_side(_side(["connect", "transfer"], stalled), 1))
    assert not found.ok and "MTU" in found.fix and "UCX_TCP_USER_TIMEOUT" in found.fix
    missing = {
        "ok": False,
        "role": "fetch",
        "error": "RuntimeError: no NIXL module importable (nixl, nixl_cu12)",
    }
    found = verdict(FACTS, parse_side("", 0), parse_side(_side([], missing), 1))
    assert "does not load" in found.summary and "invoke provision" in found.fix


def test_a_mooncake_pair_that_cannot_connect_names_the_engine_s_ports() -> None:
    facts = replace(FACTS, library="mooncake")
    fetch = ProbeSide(("side_channel", "register", "connect"), {"ok": False, "error": "TCP x:1: refused"}, 1)
    found = verdict(facts, ProbeSide(("register", "side_channel"), None, 0), fetch)
    assert (
        not found.ok and "Mooncake could not connect to lab-p1's engine (TCP x:1: refused)" in found.summary
    )
    assert "the ports Mooncake's transfer engine listens on" in found.fix


def test_the_commands_bound_each_side_and_carry_the_probe_in_argv() -> None:
    fetch = shlex.split(fetch_command("/opt/pdfleet/venv/bin/python", "198.18.0.11", 5599, "/e.env", PROBE))
    assert fetch[:5] == ["timeout", str(FETCH_TIMEOUT_S), "/opt/pdfleet/venv/bin/python", "-c", PROBE]
    assert fetch[5:] == [
        "fetch",
        "--library",
        "nixl",
        "--peer",
        "198.18.0.11",
        "--port",
        "5599",
        "--timeout",
        "10",
        "--env-file",
        "/e.env",
    ]
    serve = serve_command("/v/bin/python", 5599, "/e.env", "/tmp/x.log", PROBE)
    assert serve.startswith("nohup timeout 20 /v/bin/python -c ") and serve.endswith(
        "> /tmp/x.log 2>&1 & echo $!"
    )
    assert " serve --port 5599 --bytes 67108864 " in serve


def test_the_probe_program_reports_a_missing_library_as_its_result(tmp_path: Path) -> None:
    """The program itself, run by a Python without NIXL: one JSON line saying so, exit 1."""
    env = tmp_path / "kv.env"
    env.write_text('UCX_TLS="tcp"\n')
    args = ["fetch", "--peer", "127.0.0.1", "--port", "1", "--env-file", str(env)]
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=60)
    side = parse_side(proc.stdout, proc.returncode)
    assert proc.returncode == 1 and side.result is not None and not side.result["ok"]
    assert "no NIXL module importable" in str(side.result["error"]), proc.stdout + proc.stderr


def test_kv_pairs_are_each_models_prefill_and_decode_hosts_same_host_included() -> None:
    inv = load_inventory(REPO / "inventory" / "lab.yml")
    prof = profile("lab-cross")
    pairs = kv_pairs(build_topology(prof, inv), list(inv.hosts.values()))
    assert [(p.name, d.name) for p, d in pairs] == [("lab-p1", "lab-d1")]
    same = profile("lab-same-host")
    inv_same = load_inventory(REPO / "inventory" / "lab-same-host.yml")
    pairs = kv_pairs(build_topology(same, inv_same), list(inv_same.hosts.values()))
    assert pairs and all(p.name == d.name for p, d in pairs)


@pytest.mark.sshd
def test_verify_kv_path_over_ssh_fails_naming_the_library_where_it_is_missing(tmp_path: Path, sshd) -> None:  # type: ignore[no-untyped-def]
    """--kv-path on a loopback same-host pair whose venv (this interpreter's) has no NIXL: the check runs both
    sides over SSH and fails with the fix; without --kv-path it is not collected."""
    inv_file = tmp_path / "inv.yml"
    host = (
        f"          ansible_host: 127.0.0.1\n          ansible_port: {sshd.port}\n"
        f"          ansible_user: root\n          ansible_ssh_private_key_file: {sshd.key_file}\n"
        f"          pdfleet_known_hosts_file: {sshd.known_hosts}\n"
    )
    inv_file.write_text(
        "all:\n  children:\n    prefill:\n      hosts:\n        loop:\n" + host + "          gpus: [0, 1]\n"
        "    decode:\n      hosts:\n        loop: {}\n"
    )
    inv = load_inventory(inv_file)
    prof = profile("same-host-pcie", vllm={"venv": str(Path(sys.executable).parent.parent)})
    topology = build_topology(prof, inv)
    options = VerifyOptions(checks="kv_path", connect_timeout=5, kv_path=True, kv_probe_source=PROBE)
    [result] = run_verify(prof, topology, [inv.hosts["loop"]], options).results
    assert result.check == "kv_path/kv_path" and result.host == "loop->loop"
    assert result.outcome == FAIL and "no NIXL module importable" in result.detail, result.detail
    summary, fix = split_message(result.detail)  # as `invoke doctor --kv-path` reads it
    assert "no NIXL module importable" in summary and "invoke provision" in fix
    assert run_verify(prof, topology, [inv.hosts["loop"]], VerifyOptions(checks="kv_path")).results == []

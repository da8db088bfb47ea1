"""NIXL between lab-p1 and lab-d1 (issue 29), with the library turned on in a profile extending lab-cross
(lab-cross leaves it off: its install would cost every from-scratch provision) and installed by its
kv_transfer role on the P/D hosts, which also restarts their simulators to move KV through it:

- streamed chats through the gateway's disaggregated pool move their (scaled) KV bytes lab-p1 -> lab-d1
  through NIXL: the decode instance's vllm:nixl_bytes_transferred counts them, NIXL's own lines are in its
  unit's log, as many bytes crossed lab-d1's interface, 0 failed;
- `invoke verify --kv-path` moves 64 MiB and the pair reports a throughput; with UCX's data ports on lab-p1
  blocked from lab-d1, the check fails within 15 s naming the ports and the fix (at once when refused: the
  probe opens a TCP connection to each data listener first, where UCX would retry until it is killed).

States, not latencies. The library stays installed (lab-cross's provision removes nothing); the test puts
lab-cross's kv-transfer.env back on the P/D hosts at its end."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai

from pdfleet.metrics.scrape import scrape_metrics
from pdfleet.sim.kv_library import BUFFER_BYTES, scaled
from tests.lab.helpers import REPO_ROOT, LabHandle, derived_profile, lab_deployment, lab_env, sdk_verify

PROFILE = "lab-cross"
CHECK = "test_kv_path[lab-p1->lab-d1]"
DATA_PORTS = "20100-20199"  # lab-cross's kv_transfer.ucx_tcp_port_range
FRACTION = 0.001  # kv_transfer.sim_bytes_fraction's default
KV_BYTES_8B = 131072  # Llama-3.1-8B's KV bytes a token at bf16 (lab-cross's model)
STREAMS = 6
MODEL = "llama-3.1-8b"  # lab-cross's served model name


def _with_library(tmp_path: Path) -> str:
    """lab-cross with kv_transfer.sim_library on, beside a copy of the repo's profiles."""
    text = f"extends: {PROFILE}\nkv_transfer:\n  sim_library: true\n"
    return derived_profile(tmp_path, "lab-cross-nixl", text)


def _install(profile: str, inventory: Path) -> None:
    """The kv_transfer role on the P/D hosts: NIXL's CPU build and numpy into the simulator's venv, and
    kv-transfer.env (with the library: the simulators restart to move KV through it)."""
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


def _rx_bytes(lab: LabHandle, host_name: str, peer: str) -> int:
    """Bytes received so far on the interface `host_name` reaches `peer` through (its kernel's counter)."""
    host = next(h for h in lab.hosts if h.name == host_name)
    dev = f"$(ip -o route get {peer} | awk '{{for (i = 1; i < NF; i++) if ($i == \"dev\") print $(i + 1)}}')"
    command = f"cat /sys/class/net/{dev}/statistics/rx_bytes"
    rc, out, err = lab.ssh(host, command)
    assert rc == 0, out + err
    return int(out.strip())


def _chat(client: openai.OpenAI, n: int) -> int:
    """One streamed chat to the disaggregated pool, read to its end; its prompt tokens."""
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": f"{n} Tell me about KV caches. " + "kv " * (600 + 50 * n)}],
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"X-Pdfleet-Pool": "disagg"},
    )
    chunks = list(stream)
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 8
    return int(usage.prompt_tokens)


def _streams_move_their_bytes_through_nixl(lab: LabHandle) -> None:
    """STREAMS streamed chats, three at a time, through the gateway's disaggregated pool: each one's blocks
    at FRACTION of their KV bytes went lab-p1 -> lab-d1 through NIXL (decode's counters, NIXL's log lines,
    lab-d1's interface), none failed."""
    instances = {i.pool: i for i in lab_deployment(PROFILE).topology.instances}
    prefill, decode = instances["prefill"], instances["decode"]
    # the pool's one pair is lab-p1 -> lab-d1: the interface and the journal read below are theirs
    assert (prefill.host, decode.host) == ("lab-p1", "lab-d1"), (prefill.host, decode.host)
    env = lab_env()
    client = openai.OpenAI(
        base_url=env["OPENAI_BASE_URL"],
        api_key=env["OPENAI_API_KEY"],
        max_retries=0,
        timeout=120,
        http_client=openai.DefaultHttpxClient(verify=sdk_verify(env)),
    )
    p1 = next(h for h in lab.hosts if h.name == "lab-p1")
    before, rx_before = scrape_metrics(decode.url), _rx_bytes(lab, "lab-d1", p1.address)
    with ThreadPoolExecutor(3) as pool:
        prompts = list(pool.map(lambda n: _chat(client, n), range(STREAMS)))
    after, rx_after = scrape_metrics(decode.url), _rx_bytes(lab, "lab-d1", p1.address)
    want = sum(-(-p // 16) * scaled(p * KV_BYTES_8B, -(-p // 16), FRACTION, BUFFER_BYTES) for p in prompts)
    moved = after["vllm:nixl_bytes_transferred_sum"] - before["vllm:nixl_bytes_transferred_sum"]
    count = after["vllm:nixl_bytes_transferred_count"] - before["vllm:nixl_bytes_transferred_count"]
    failed = "vllm:nixl_num_failed_transfers_total"
    assert (count, moved, after[failed] - before[failed]) == (STREAMS, want, 0), (count, moved, want)
    assert rx_after - rx_before >= moved, (rx_after - rx_before, moved)  # the bytes crossed the bridge
    d1 = next(h for h in lab.hosts if h.name == "lab-d1")
    rc, out, err = lab.ssh(d1, f"sudo journalctl -u {decode.unit} --no-pager -n 400")
    assert rc == 0 and "Initialized NIXL agent: pdfleet-sim-" in out, err + out[-2000:]
    assert "NIXL transfer failed" not in out and "Handshake failed" not in out


def test_verify_kv_path_moves_bytes_then_fails_naming_a_blocked_data_port(
    lab: LabHandle, tmp_path: Path
) -> None:
    inventory = lab.lab.inventory
    profile = _with_library(tmp_path)
    _install(profile, inventory)
    try:
        _streams_move_their_bytes_through_nixl(lab)
        _verify_then_block(lab, profile, inventory, tmp_path)
    finally:  # lab-cross's own kv-transfer.env back: the simulators no longer load the library
        _install(PROFILE, inventory)


def _verify_then_block(lab: LabHandle, profile: str, inventory: Path, tmp_path: Path) -> None:
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

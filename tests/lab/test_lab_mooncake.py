"""`invoke provision --profile lab-cross-mooncake` against the lab: P/D over MooncakeConnector (vLLM
0.33.0's, simulated): the gateway's vllm-router in mooncake mode reads the prefill's bootstrap server,
a streamed chat through the gateway's disaggregated pool moves its KV from prefill to decode — its scaled
bytes lab-p1 -> lab-d1 through Mooncake's real transfer engine (kv_transfer.sim_library: the prefill's
vllm:mooncake_bytes_transferred, the engine's own log lines on lab-d1, lab-d1's interface), and under load
(0 failed requests, 0 failed receives) `invoke monitor` and the rollout's KV gate read Mooncake's
transfer-time histogram.
Leaves lab-cross owed back (tests/lab/conftest.py: SWITCHING): the next module switches from this profile."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

import openai
import pytest

from pdfleet.metrics.scrape import scrape_metrics
from pdfleet.sim.kv_library import BUFFER_BYTES, scaled
from tests.lab.helpers import (
    REPO_ROOT,
    LabCrossOwed,
    LabHandle,
    lab_host,
    prometheus_url,
    sdk_verify,
    wait_for,
)

INVOKE = [sys.executable, "-m", "invoke"]
PROFILE = "lab-cross-mooncake"
MODEL = "llama-3.1-8b"
PREFILL_URL = "http://198.18.0.21:8100"
DECODE_URL = "http://198.18.0.31:8200"
BOOTSTRAP_URL = "http://198.18.0.21:8998"  # kv_transfer.mooncake_bootstrap_port, its default
POOL_HEADER = "X-Pdfleet-Pool"
CONTROLLER_CONFIG = "/etc/pdfleet/rollout/controller.json"  # pdfleet.rollout.config.DEFAULT_CONFIG
FRACTION = 0.001  # kv_transfer.sim_bytes_fraction's default
KV_BYTES_8B = 131072  # Llama-3.1-8B's KV bytes a token at bf16 (the lab's model)
FAILED_RECVS = "vllm:mooncake_num_failed_recvs_total"


def _invoke(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*INVOKE, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=900, check=False
    )


@pytest.fixture(scope="module")
def client(
    lab: LabHandle, lab_cross_owed: LabCrossOwed, tmp_path_factory: pytest.TempPathFactory
) -> openai.OpenAI:
    """lab-cross-mooncake provisioned (twice: the second run changes nothing); the SDK set up from
    `invoke lab.env`. lab-cross is owed back from the first provision on."""
    tmp = tmp_path_factory.mktemp("mooncake")
    lab_cross_owed.owed = True
    for run in ("first", "second"):
        report = tmp / f"{run}.json"
        proc = _invoke("provision", "--profile", PROFILE, "--json", str(report))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    second = json.loads(report.read_text())
    assert second["totals"]["changed"] == 0, {h: v["changes"] for h, v in second["hosts"].items()}
    env_proc = _invoke("lab.env", "--profile", PROFILE)
    assert env_proc.returncode == 0, env_proc.stderr
    env = dict(line.removeprefix("export ").partition("=")[::2] for line in env_proc.stdout.splitlines())
    env = {key: value.strip("'\"") for key, value in env.items()}
    return openai.OpenAI(
        base_url=env["OPENAI_BASE_URL"],
        api_key=env["OPENAI_API_KEY"],
        max_retries=0,
        timeout=120,
        http_client=openai.DefaultHttpxClient(verify=sdk_verify(env)),  # the lab CA (SSL_CERT_FILE)
    )


def test_the_router_runs_in_mooncake_mode_against_the_prefill_bootstrap_server(
    lab: LabHandle, client: openai.OpenAI
) -> None:
    gw = next(h for h in lab.hosts if h.name == "lab-gw")
    rc, out, err = lab.ssh(gw, "systemctl cat vllm-router-pd.service")
    assert rc == 0 and "--kv-connector mooncake" in out and f"--prefill {PREFILL_URL} 8998" in out, err
    rc, out, err = lab.ssh(gw, f"curl -fsS {BOOTSTRAP_URL}/query")
    assert rc == 0, err
    (entry,) = json.loads(out).values()  # one DP rank: the prefill engine and its worker's address
    assert entry["engine_id"] and entry["worker_addr"]["0"]["0"].startswith("tcp://198.18.0.21:")
    rc, out, err = lab.ssh(gw, "sudo journalctl -u vllm-router-pd.service --no-pager | tail -n 400")
    assert rc == 0 and "Got Mooncake engine_ids for" in out, err


def _rx_bytes(lab: LabHandle) -> int:
    """Bytes lab-d1 received so far on its interface to lab-p1 (the kernel's counter)."""
    peer = lab_host(lab, "lab-p1").address
    dev = f"$(ip -o route get {peer} | awk '{{for (i = 1; i < NF; i++) if ($i == \"dev\") print $(i + 1)}}')"
    rc, out, err = lab.ssh(lab_host(lab, "lab-d1"), f"cat /sys/class/net/{dev}/statistics/rx_bytes")
    assert rc == 0, out + err
    return int(out.strip())


def test_a_streamed_chat_through_the_gateway_moves_its_kv_over_mooncake(
    lab: LabHandle, client: openai.OpenAI
) -> None:
    decode_before, prefill_before = scrape_metrics(DECODE_URL), scrape_metrics(PREFILL_URL)
    rx_before = _rx_bytes(lab)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell me about KV caches. " * 200}],
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={POOL_HEADER: "disagg"},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 16
    decode, prefill = scrape_metrics(DECODE_URL), scrape_metrics(PREFILL_URL)
    success = "vllm:request_success_total"
    assert prefill[success] - prefill_before[success] == 1  # the router's max_tokens=1 prefill leg
    assert decode[success] - decode_before[success] == 1
    # the decode counts the whole prompt once, the KV it received included, as vLLM does (issue 25 item 2)
    counted = decode["vllm:prompt_tokens_total"] - decode_before["vllm:prompt_tokens_total"]
    assert counted == chunks[-1].usage.prompt_tokens
    # Mooncake pushes from P: the prefill instance observed the transfer (issue 25 item 4)
    pushed = "vllm:mooncake_xfer_time_seconds_count"
    assert prefill[pushed] - prefill_before[pushed] == 1
    assert prefill["vllm:kv_cache_usage_perc"] == 0.0  # the held blocks were read and freed
    assert not any(name.startswith("vllm:nixl_") for name in decode)  # MooncakeConnector, not NIXL
    # its blocks at FRACTION of their KV bytes went lab-p1 -> lab-d1 through Mooncake's engine: the bytes
    # the prefill's stats observed (the engine's, reported by the decode), as many on lab-d1's interface
    prompt = chunks[-1].usage.prompt_tokens
    blocks = -(-prompt // 16)
    want = blocks * scaled(prompt * KV_BYTES_8B, blocks, FRACTION, BUFFER_BYTES)
    moved = "vllm:mooncake_bytes_transferred_sum"
    assert prefill[moved] - prefill_before[moved] == want
    assert decode[FAILED_RECVS] - decode_before[FAILED_RECVS] == 0
    assert _rx_bytes(lab) - rx_before >= want
    d1 = lab_host(lab, "lab-d1")
    rc, out, err = lab.ssh(d1, "sudo journalctl -u vllm-decode.service --no-pager -n 400")
    assert rc == 0 and "Transfer Engine RPC using P2P handshake" in out, (
        err + out[-2000:]
    )  # the engine's glog
    assert f"KV bytes move through Mooncake's transfer engine (tcp, P2PHANDSHAKE at {d1.address}:" in out
    assert "pulling kv_caches for" not in out


def _stream(client: openai.OpenAI, words: int) -> None:
    """One streamed chat to the disaggregated pool, read to its end."""
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell me about KV caches. " * words}],
        max_tokens=16,
        stream=True,
        extra_headers={POOL_HEADER: "disagg"},
    )
    for _ in stream:
        pass


def _cells(line: str) -> list[str]:
    """The quantile cells of one `invoke monitor` chain row (a figure, `<300 ms`, or `no data`)."""
    return re.findall(r"<?\d+(?:\.\d+)? (?:ms|s)|no data", line)


def _rated(prometheus: str, window: str) -> bool:
    """Prometheus has a rate of Mooncake's transfers over `window` (two scrapes in it apart by some)."""
    query = f"sum(rate(vllm:mooncake_xfer_time_seconds_count[{window}])) > 0"
    url = f"{prometheus}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - the lab's Prometheus
        return bool(json.loads(resp.read())["data"]["result"])


def _monitor_once_transfers_show(within_s: float = 60) -> subprocess.CompletedProcess[str]:
    """`invoke monitor` every few seconds until its prefill KV row has six figures (lab-cross's 15 s rule
    window then holds transfers, and the 20 s rollout window too), or the last run at the bound. The first
    look once Prometheus rates the load's transfers over the 15 s window (polled every 0.5 s: it scrapes
    every 2 s), not after a fixed 10 s."""
    deadline, prometheus = time.monotonic() + within_s, prometheus_url(PROFILE)
    wait_for(lambda: _rated(prometheus, "15s"), within_s, "Mooncake's transfers rated by Prometheus", 0.5)
    while True:
        monitor = _invoke("monitor", "--profile", PROFILE, "--minutes", "5")
        rows = [_cells(line) for line in monitor.stdout.splitlines() if line.startswith("KV transfer")]
        full = [cells for cells in rows if len(cells) == 6 and "no data" not in cells]
        if full or time.monotonic() > deadline:
            return monitor
        time.sleep(2.0)


def test_under_load_monitor_and_the_rollout_kv_gate_read_mooncake_s_histogram(
    lab: LabHandle, client: openai.OpenAI
) -> None:
    """Issue 25 item 4 in the lab: with chats streaming through the disaggregated pool, `invoke monitor`
    prints the KV-transfer step from vllm:mooncake_xfer_time_seconds on the prefill instance (Mooncake
    pushes from P) with a figure in each of its six columns (the decode's row, if shown, has none) and
    Mooncake's failed transfers/s; the rollout controller on lab-gw is configured with that histogram
    and role, its dry run showing the KV gate's value (`-` when the series it reads is absent, as NIXL's
    is on a Mooncake fleet)."""
    gw = next(h for h in lab.hosts if h.name == "lab-gw")
    rc, out, err = lab.ssh(gw, f"sudo cat {CONTROLLER_CONFIG}")
    assert rc == 0, err
    (model,) = json.loads(out)["models"]  # the profile's one model
    assert (model["kv_transfer_histogram"], model["kv_transfer_role"]) == (
        "vllm:mooncake_xfer_time_seconds",
        "prefill",
    ), model
    stop, errors = threading.Event(), []

    def load() -> None:
        while not stop.is_set():
            try:
                _stream(client, 200)
                _stream(client, 1200)  # ~7K tokens: a transfer of some size
            except Exception as exc:  # noqa: BLE001 - reported by the test, not lost in the thread
                errors.append(exc)
                return

    decode_before = scrape_metrics(DECODE_URL)
    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    try:
        monitor = _monitor_once_transfers_show()
        dry_run = _invoke("rollout", "--profile", PROFILE, "--stage", "long-prompts", "--dry-run")
    finally:
        stop.set()
        worker.join(180)
    assert not errors, errors  # 0 failed requests
    decode_after = scrape_metrics(DECODE_URL)
    assert decode_after[FAILED_RECVS] == decode_before[FAILED_RECVS]  # none failed in Mooncake's engine
    assert monitor.returncode == 0, monitor.stdout[-3000:] + monitor.stderr[-3000:]
    rows = {}  # role: the row's six cells
    for line in monitor.stdout.splitlines():
        if line.startswith("KV transfer"):
            _, _, connector, pool, role, *_ = line.split()
            assert (connector, pool) == ("(Mooncake)", "disagg"), line
            rows[role] = _cells(line)
    assert len(rows["prefill"]) == 6 and "no data" not in rows["prefill"], monitor.stdout
    # the decode registers the histogram too but never observes it (stats.py: populated on P only)
    assert set(rows) <= {"prefill", "decode"} and rows.get("decode", ["no data"]) == ["no data"] * len(
        rows.get("decode", ["no data"])
    ), monitor.stdout
    # Mooncake's sender and receiver failure counters as one rate, per role: a figure (0 here), not the
    # "no data" of a rule Prometheus fails to evaluate
    failed = [line for line in monitor.stdout.splitlines() if line.startswith("failed KV transfers/s")]
    assert failed and not any(line.endswith("no data") for line in failed), monitor.stdout
    assert dry_run.returncode == 0, dry_run.stdout[-3000:] + dry_run.stderr[-3000:]
    (gate,) = [line.split() for line in dry_run.stdout.splitlines() if line.startswith("kv-transfer-p99-slo")]
    assert gate[2] != "-" and float(gate[2]) > 0, dry_run.stdout

"""`invoke doctor` against the lab (lab-cross): each catalogue entry made for real, and doctor names it with
the fix; on the healthy lab it reports no error and no tuning finding, nor a preemption one under the decode
tuning test's load. Every fault a test makes is undone in its `finally`.

Client view: a key with a trailing space, a base URL at a pool port, a chat body posted to /v1/completions, a
wrong Anthropic key. Fleet view: the side-channel port blocked on the decode host (nft when the host has it,
else an `ip rule ... prohibit` for that port), a prefill pool overloaded with a 512-token budget and a
decode pool short of KV blocks (derived profiles, provisioned on the one host they change).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.lab.helpers import (
    REPO_ROOT,
    LabHandle,
    derived_profile,
    gateway_url,
    lab_env,
    prometheus_url,
    sdk_verify,
    wait_for,
)

INVOKE = [sys.executable, "-m", "invoke"]
PROFILE = "lab-cross"
GATEWAY = gateway_url(PROFILE)  # the topology's: https, lab-cross is on TLS (the lab CA)
PREFILL_URL = "http://198.18.0.21:8100"  # lab-p1's prefill instance: a pool port
PREFILL_ADDRESS, SIDE_CHANNEL_PORT = "198.18.0.21", 5600  # kv_transfer.side_channel_port of cross-rdma
MODEL = "llama-3.1-8b"
KEY_VAR = "PDFLEET_DOCTOR_TEST_KEY"


def _invoke(
    *args: str, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*INVOKE, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout, check=False, env=env
    )


def _doctor(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    """`invoke doctor ARGS --json` in a shell where `eval "$(invoke lab.env)"` ran (SSL_CERT_FILE: the lab
    CA, which the SDKs and so doctor's probes trust), `env` over it: the exit status and the JSON document."""
    shell = {**os.environ, "SSL_CERT_FILE": lab_env()["SSL_CERT_FILE"], **(env or {})}
    proc = _invoke("doctor", *args, "--json", env=shell, timeout=180)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def _found(doc: dict[str, Any], rule: str) -> dict[str, Any]:
    hits = [f for f in doc["findings"] if f["rule"] == rule]
    assert hits, f"{rule} not among {[f['rule'] for f in doc['findings']]}"
    return hits[0]


def _errors(doc: dict[str, Any]) -> list[str]:
    return [f"{f['rule']}: {f['what']}" for f in doc["findings"] if f["severity"] == "error"]


@pytest.fixture(scope="session")
def lab_cross_once(lab: LabHandle, tmp_path_factory: pytest.TempPathFactory) -> None:
    """lab-cross provisioned once a session, not once a module: the suite runs this file's client
    catalogue among the state tests and its fleet-view tests after them (conftest STATES), and a module
    fixture provisioned again for those, on a fleet every module leaves on lab-cross (what the SWITCHING
    modules owe is paid before: conftest PAYS_LAB_CROSS, lab_cross_back)."""
    report = tmp_path_factory.mktemp("doctor") / "report.json"
    proc = _invoke("provision", "--profile", PROFILE, "--json", str(report))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.fixture
def key(lab_cross_once: None) -> str:
    """lab-cross provisioned; the client key `invoke lab.env` hands a shell."""
    return lab_env()["OPENAI_API_KEY"]


def _host(lab: LabHandle, name: str):  # noqa: ANN202 - LabHost
    return next(h for h in lab.hosts if h.name == name)


# ---- the healthy lab ---------------------------------------------------------------------------


def test_healthy_client_view_has_no_error(key: str) -> None:
    rc, doc = _doctor("--base-url", GATEWAY + "/v1", "--api-key-env", KEY_VAR, env={KEY_VAR: key})
    assert rc == 0 and not _errors(doc), doc
    assert key not in json.dumps(doc)


def test_healthy_anthropic_view_has_no_error(key: str) -> None:
    env = {"ANTHROPIC_BASE_URL": GATEWAY, "ANTHROPIC_API_KEY": key, "ANTHROPIC_AUTH_TOKEN": ""}
    rc, doc = _doctor("--anthropic", env=env)
    assert rc == 0 and not _errors(doc), doc


def test_healthy_fleet_view_has_no_error(key: str) -> None:
    proc = _invoke("doctor", "--profile", PROFILE, "--minutes", "1", "--json", timeout=180)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0 and not _errors(doc), doc
    # the tuning rules' negative control: a healthy lab without a load burst gets no advice
    assert not [f for f in doc["findings"] if f["rule"].startswith("tuning.")], doc["findings"]
    # lab-cross's monitoring.port is not Prometheus's 9090: the figures come from the one listening on it
    assert f"metrics: Prometheus at {prometheus_url(PROFILE)}\n" in proc.stderr, proc.stderr


# ---- the client catalogue ----------------------------------------------------------------------


def test_a_trailing_space_in_the_key(key: str) -> None:
    rc, doc = _doctor("--base-url", GATEWAY + "/v1", "--api-key-env", KEY_VAR, env={KEY_VAR: key + " "})
    found = _found(doc, "client.key_whitespace")
    assert rc == 1 and found["severity"] == "error" and "tr -d" in found["fix"]
    assert key not in json.dumps(doc)


def test_a_base_url_at_a_pool_port(key: str) -> None:
    rc, doc = _doctor("--base-url", PREFILL_URL + "/v1", "--api-key-env", KEY_VAR, env={KEY_VAR: key})
    found = _found(doc, "client.pool_port")
    assert rc == 1 and "point at the gateway" in found["fix"]


def test_a_chat_body_posted_to_completions(key: str, tmp_path: Path) -> None:
    body = tmp_path / "body.json"
    body.write_text(
        json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    )
    rc, doc = _doctor(
        "--base-url",
        GATEWAY + "/v1",
        "--api-key-env",
        KEY_VAR,
        "--endpoint",
        "completions",
        "--body",
        str(body),
        env={KEY_VAR: key},
    )
    found = _found(doc, "client.wrong_endpoint")
    assert rc == 1 and "KeyError 'choices'" in found["what"] and "chat/completions" in found["fix"]


def test_a_wrong_anthropic_key(key: str) -> None:
    env = {
        "ANTHROPIC_BASE_URL": GATEWAY,
        "ANTHROPIC_API_KEY": "sk-ant-not-the-lab-key-0000",
        "ANTHROPIC_AUTH_TOKEN": "",
    }
    rc, doc = _doctor("--anthropic", "--model", MODEL, env=env)
    found = _found(doc, "anthropic.authentication_error")
    assert rc == 1 and "gateway-client.key" in found["fix"]
    assert "not-the-lab-key" not in json.dumps(doc)


# ---- the fleet catalogue -----------------------------------------------------------------------


def _block_commands(lab: LabHandle) -> tuple[str, str]:
    """(block, unblock) of TCP to the prefill side channel, run on the decode host: nft if installed there,
    else a policy-routing rule for that destination and port (iproute2 is in every lab image)."""
    rc, _, _ = lab.ssh(_host(lab, "lab-d1"), "command -v nft")
    if rc == 0:
        table = "inet pdfleet_doctor_test"
        return (
            f"sudo nft add table {table} && sudo nft add chain {table} out "
            f"'{{ type filter hook output priority 0 ; }}' && sudo nft add rule {table} out "
            f"ip daddr {PREFILL_ADDRESS} tcp dport {SIDE_CHANNEL_PORT} drop",
            f"sudo nft delete table {table}",
        )
    # numeric: the lab image has no /etc/protocols, so iproute2 does not know "tcp"
    rule = f"priority 90 to {PREFILL_ADDRESS} ipproto 6 dport {SIDE_CHANNEL_PORT} prohibit"
    return f"sudo ip rule add {rule}", f"sudo ip rule del {rule}"


def test_the_side_channel_blocked_on_the_decode_host(lab: LabHandle, key: str) -> None:
    block, unblock = _block_commands(lab)
    decode = _host(lab, "lab-d1")
    rc, out, err = lab.ssh(decode, block)
    assert rc == 0, out + err
    try:
        rc, doc = _doctor("--profile", PROFILE, "--minutes", "1")
    finally:
        lab.ssh(decode, unblock)
    found = _found(doc, "kv.side_channel")
    assert rc == 1 and "lab-d1" in found["what"] and f"{PREFILL_ADDRESS}:{SIDE_CHANNEL_PORT}" in found["what"]
    assert f"allow TCP {SIDE_CHANNEL_PORT}" in found["fix"]


def _provision_one(profile: str, host: str, report: Path) -> None:
    """The services of one host under `profile` (what a pool's settings change), started and healthy."""
    proc = _invoke(
        "provision", "--profile", profile, "--roles", "services", "--limit", host, "--json", str(report)
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _load(key: str, n: int, words: int, max_tokens: int) -> None:
    """`n` concurrent requests forced to the disaggregated pool through the gateway, each prompt its own
    (no prefix cache hit lightens the load)."""
    http = openai.DefaultHttpxClient(verify=sdk_verify(lab_env()))
    client = openai.OpenAI(
        base_url=GATEWAY + "/v1", api_key=key, max_retries=0, timeout=180, http_client=http
    )

    def one(i: int) -> None:
        client.completions.create(
            model=MODEL,
            prompt=f"request{i} " + "word " * words,
            max_tokens=max_tokens,
            extra_headers={"X-Pdfleet-Pool": "disagg"},
        )

    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        list(pool.map(one, range(n)))


# The two tuning loads: prompts that queue on a 512-token prefill budget, and requests that outgrow a
# short decode KV cache. The healthy lab under the decode load preempts too little for a finding (the
# negative control): the decode finding comes from the short KV cache, not from the load. The prefill load
# has no such control: on the healthy lab its burst queues as long (P95 1.8 s for 8 prompts, 3 s for 16) and
# the rule fires there too, so that test shows the rule's advice, not that the budget caused the queue.
PREFILL_LOAD = {"n": 16, "words": 6000, "max_tokens": 1}
DECODE_LOAD = {"n": 40, "words": 800, "max_tokens": 600}


def _scraped_after_the_load(ended: float, timeout: float = 30) -> None:
    """Until Prometheus has scraped every vLLM target after `ended` (this machine's clock, which the lab's
    containers share): the load's last observations are in the figures doctor reads. A poll, not the fixed
    6 s (three of the lab's 2 s scrape intervals) this waited before."""
    query = urllib.parse.urlencode({"query": 'min(timestamp(up{job="vllm"}))'})
    url = f"{prometheus_url(PROFILE)}/api/v1/query?{query}"

    def scraped() -> bool:
        with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - the lab's Prometheus
            result = json.loads(resp.read())["data"]["result"]
        return bool(result) and float(result[0]["value"][1]) > ended

    wait_for(scraped, timeout, "a scrape of every vLLM target after the load", every=0.25)


def _loaded(key: str, load: dict[str, int]) -> None:
    """The load, then every vLLM target scraped after it."""
    _load(key, **load)
    _scraped_after_the_load(time.time() + 1)  # a second for the last observations


def _rules(doc: dict[str, Any]) -> list[str]:
    return [f["rule"] for f in doc["findings"]]


def test_the_healthy_lab_under_the_decode_load_has_no_preemption_finding(key: str) -> None:
    _loaded(key, DECODE_LOAD)
    rc, doc = _doctor("--profile", PROFILE, "--minutes", "1")
    evidence = [(f["rule"], f["evidence"]) for f in doc["findings"]]
    assert rc == 0 and "tuning.decode_preemption" not in _rules(doc) and not _errors(doc), evidence


def test_a_prefill_pool_with_a_small_token_budget(key: str, tmp_path: Path) -> None:
    profile = derived_profile(
        tmp_path,
        "lab-cross-small-budget",
        "extends: lab-cross\npools:\n  prefill:\n    max_num_batched_tokens: 512\n",
    )
    try:
        _provision_one(profile, "lab-p1", tmp_path / "small.json")
        _loaded(key, PREFILL_LOAD)
        rc, doc = _doctor("--profile", profile, "--minutes", "1")
    finally:
        _provision_one(PROFILE, "lab-p1", tmp_path / "restore.json")
    found = _found(doc, "tuning.prefill_queue")
    # advice, not a fault: a warning, and doctor exits 0 (1 is for errors)
    assert rc == 0 and found["severity"] == "warning" and not _errors(doc), doc["findings"]
    assert "+pools.prefill.max_num_batched_tokens: 1024" in found["diff"]
    assert "vllm:request_queue_time_seconds" in found["evidence"]


def test_a_decode_pool_short_of_kv_blocks(key: str, tmp_path: Path) -> None:
    # 0.25 of a simulated H100 leaves ~25K tokens of KV after the weights: 40 requests growing past 1K
    # tokens each cannot all stay resident, so the scheduler preempts
    profile = derived_profile(
        tmp_path,
        "lab-cross-short-kv",
        "extends: lab-cross\npools:\n  decode:\n    gpu_memory_utilization: 0.25\n    max_model_len: 16384\n",
    )
    try:
        _provision_one(profile, "lab-d1", tmp_path / "short.json")
        _loaded(key, DECODE_LOAD)
        rc, doc = _doctor("--profile", profile, "--minutes", "1")
    finally:
        _provision_one(PROFILE, "lab-d1", tmp_path / "restore.json")
    found = _found(doc, "tuning.decode_preemption")
    assert rc == 0 and found["severity"] == "warning" and not _errors(doc), doc["findings"]
    assert "max_num_seqs" in found["diff"] and "fp8" in found["fix"]
    assert "vllm:num_preemptions_total" in found["evidence"]

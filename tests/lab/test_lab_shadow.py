"""Shadow traffic on lab-cross (issue 33), states not latencies: `invoke shadow` starts a run on the lab's
gateway, live long prompts are also sent to the P/D pool (the clients see only their colocated answers),
the shadow series reach Prometheus and `invoke shadow.report` gives a verdict; with the decode service
stopped mid-shadow, shadows are dropped with a reason and no client request fails."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest

from pdfleet.bench.workloads import words
from pdfleet.metrics.prometheus import PrometheusClient
from tests.lab.helpers import REPO_ROOT, LabHandle, lab_env, prometheus_url, sdk_verify

PROFILE = "lab-cross"
MODEL = "llama-3.1-8b"
LONG_TOKENS = 9000  # past lab-cross's gateway.long_prompt_tokens (8192)


def _invoke(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "invoke", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600
    )


def _host(lab: LabHandle, name: str) -> Any:
    return next(h for h in lab.hosts if h.name == name)


@pytest.fixture(scope="module")
def client(lab: LabHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    """lab-cross provisioned (its gateway running this tree's code); the SDK with `invoke lab.env`'s key;
    the shadow run stopped and the decode service started again at the end."""
    report = tmp_path_factory.mktemp("shadow") / "report.json"
    proc = _invoke("provision", "--profile", PROFILE, "--json", str(report))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    env = lab_env()
    yield openai.OpenAI(
        base_url=env["OPENAI_BASE_URL"],
        api_key=env["OPENAI_API_KEY"],
        timeout=120,
        http_client=openai.DefaultHttpxClient(verify=sdk_verify(env)),  # the lab CA (SSL_CERT_FILE)
    )
    _invoke("shadow.stop", "--profile", PROFILE)
    lab.ssh(_host(lab, "lab-d1"), "sudo -n systemctl start vllm-decode.service")


def _stream(client: openai.OpenAI, prompt: str) -> str:
    """One streamed completion without the pool header (the gateway decides); the pool that served it."""
    raw = client.completions.with_raw_response.create(
        model=MODEL, prompt=prompt, max_tokens=8, stream=True, extra_body={"ignore_eos": True}
    )
    chunks = [c for c in raw.parse() if c.choices and c.choices[0].text]
    assert len(chunks) == 8
    return raw.headers["X-Pdfleet-Pool"]


def _traffic(client: openai.OpenAI, n: int, seed: int) -> list[str]:
    """`n` long prompts and `n` short ones, four at a time; the pools that served them."""
    rng = random.Random(seed)
    prompts = [words(LONG_TOKENS, rng) for _ in range(n)] + [words(200, rng) for _ in range(n)]
    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda p: _stream(client, p), prompts))


def _status() -> dict[str, Any]:
    """The lab gateway's run, as `invoke shadow.status` prints it (one line)."""
    proc = _invoke("shadow.status", "--profile", PROFILE)
    assert proc.returncode == 0, proc.stderr
    return {"line": proc.stdout.strip()}


def test_shadowing_long_prompts_reaches_prometheus_and_the_report(client: openai.OpenAI) -> None:
    proc = _invoke(
        "shadow",
        "--profile",
        PROFILE,
        "--stage",
        "long-prompts",
        "--share",
        "100",
        "--minutes",
        "10",
        "--detach",
    )
    assert proc.returncode == 0, proc.stderr
    assert "lab-gw: shadowing stage long-prompts at 100%" in proc.stdout, proc.stdout
    served = _traffic(client, 6, seed=1)
    assert set(served) == {"colocated"}  # the stage is colocated: the clients' own answers only
    deadline = time.monotonic() + 60
    while "6 ok, 0 failed, 0 in flight" not in (line := _status()["line"]) and time.monotonic() < deadline:
        time.sleep(1)
    assert "6 sent, 6 ok, 0 failed, 0 in flight" in line, line  # the last status read (each one ~2 s)
    prom = PrometheusClient(prometheus_url(PROFILE))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        got = prom.value("pdfleet_gateway_shadow_requests_total", ("shadow",), {"outcome": "ok"})
        if got.get(("true",), 0) >= 6 and got.get(("false",), 0) >= 6:
            break
        time.sleep(0.5)  # a poll, not a wait: lab-cross scrapes every 2 s
    assert got.get(("true",), 0) >= 6 and got.get(("false",), 0) >= 6, got
    # a second round once Prometheus holds the series: the report's quantiles are rates over the window,
    # and a series first scraped at its final count shows no increase (all six may end between scrapes);
    # one scrape interval (lab-cross's 2 s) between them
    time.sleep(2)
    _traffic(client, 2, seed=9)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        got = prom.value("pdfleet_gateway_shadow_requests_total", ("shadow",), {"outcome": "ok"})
        if got.get(("true",), 0) >= 8 and got.get(("false",), 0) >= 8:
            break
        time.sleep(0.5)  # a poll, not a wait: lab-cross scrapes every 2 s
    assert got.get(("true",), 0) >= 8 and got.get(("false",), 0) >= 8, got
    proc = _invoke("shadow.report", "--profile", PROFILE, "--minutes", "3", "--as-json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    sides = {r["side"] for r in doc["rows"] if r["class"] == "long"}
    assert sides == {"primary", "shadow"}, doc["rows"]
    shadow = next(r for r in doc["rows"] if r["side"] == "shadow")
    assert shadow["ttft_p95_ms"] is not None and shadow["errors"] == 0
    assert doc["verdict"]["decision"] in ("split", "do not split", "undecided") and doc["verdict"]["headline"]
    assert doc["figures"]["disagg"]["kv_transfer_p95_ms"] is not None  # the P/D pool moved KV for them


def test_decode_stopped_mid_shadow_drops_shadows_and_fails_no_client(
    lab: LabHandle, client: openai.OpenAI
) -> None:
    rc, _, err = lab.ssh(_host(lab, "lab-d1"), "sudo -n systemctl stop vllm-decode.service")
    assert rc == 0, err
    served: list[str] = []
    for seed in range(2, 8):  # until shadows are dropped (the P/D pool failing: unhealthy, or slots full)
        served += _traffic(client, 4, seed=seed)
        if "dropped {'" in (line := _status()["line"]):
            break
    assert set(served) == {"colocated"} and len(served) >= 8  # every client request was answered
    assert "dropped {'shadow_unhealthy'" in line or "dropped {'concurrency'" in line, line

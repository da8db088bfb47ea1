"""`invoke rebalance` on the lab (lab-cross, provisioned by the time this file runs), issue 35's legs under
steady streamed traffic with no failed request: lab-colo2 moves from the colocated pool to decode (its
drain finds streams in flight, and they finish), then lab-d1 from decode to prefill. After each move the
router, the gateway's policy and Prometheus (the new `role` label) serve the new layout and the moved host
serves requests; the layout is kept on the fleet (lab-gw, beside the live stage) with each move in its
audit log; a plain provision afterwards would change nothing (it reads the layout from the fleet). Then the
traffic stops and `invoke provision --layout-from-inventory` resets the fleet to lab-cross's layout.

lab-cross, not lab-16 (the issue's 16 hosts): lab-16 needs its own inventory booted (16 containers) and
provisioned, minutes beyond this file; the legs, the router and the drain are the same on four hosts.

Traffic: the bench's streaming client through the gateway's one key and base URL, at the long-prompts
stage (short prompts stream from the colocated pool, long ones through the router to the P/D pool, with
the gateway's fallback to the colocated pool while the router restarts to take its new instance list):
three short streams and two long ones at a time, each long enough to be in flight at a drain.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from pdfleet.bench.client import Record, StreamClient, request_bytes
from pdfleet.bench.workloads import completion_body, words
from pdfleet.gateway.tls import client_context
from pdfleet.metrics.scrape import scrape_metrics
from tests.lab.helpers import REPO_ROOT, LabHandle, prometheus_url

INVOKE = [sys.executable, "-m", "invoke"]
PROFILE = "lab-cross"
MODEL = "llama-3.1-8b"
HOST, ADDRESS = "lab-colo2", "198.18.0.12"
DECODE_URL, COLOCATED_URL = f"http://{ADDRESS}:8200", f"http://{ADDRESS}:8000"
D1_DECODE_URL, D1_PREFILL_URL = "http://198.18.0.31:8200", "http://198.18.0.31:8100"
LONG_TOKENS = 8_750  # over the profile's 8192-token threshold: the long-prompts stage sends it to P/D
FLEET_LAYOUT = "/var/lib/pdfleet/layouts/lab-cross.json"  # on lab-gw, the inventory's gateway host


def _invoke(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*INVOKE, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )


def _ok(*args: str, timeout: float = 600) -> str:
    proc = _invoke(*args, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout


def _wait(check: Callable[[], Any], timeout: float, what: str, every: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _gw(lab: LabHandle):  # noqa: ANN202 - LabHost
    return next(h for h in lab.hosts if h.name == "lab-gw")


def _router_workers(lab: LabHandle) -> list[str]:
    rc, out, err = lab.ssh(_gw(lab), "curl -sS -f http://127.0.0.1:8090/list_workers")
    assert rc == 0, err
    return list(json.loads(out)["urls"])


def _policy_colocated(lab: LabHandle) -> list[str]:
    rc, out, err = lab.ssh(_gw(lab), "sudo -n cat /etc/pdfleet/gateway/policy.yaml")
    assert rc == 0, err
    text = out.split(f"{MODEL}:", 1)[1].split("disagg:", 1)[0]
    return [url for url in ("http://198.18.0.11:8000", COLOCATED_URL) if url in text]


def _scraped_role(instance: str, host: str = HOST) -> str | None:
    """The `role` label Prometheus scrapes a host's instance with, when its target is up."""
    query = urllib.parse.urlencode({"query": f'up{{job="vllm",host="{host}"}} == 1'})
    with urllib.request.urlopen(f"{prometheus_url(PROFILE)}/api/v1/query?{query}", timeout=10) as resp:
        result = json.loads(resp.read())["data"]["result"]
    roles = [r["metric"].get("role") for r in result if r["metric"].get("instance", "").endswith(instance)]
    return roles[0] if len(result) == 1 and roles else None


def _fleet_file(lab: LabHandle, path: str) -> str | None:
    """A file on lab-gw (None: absent)."""
    rc, out, err = lab.ssh(_gw(lab), f"sudo -n sh -c '[ -e {path} ] || exit 3; cat {path}'")
    assert rc in (0, 3), err
    return out if rc == 0 else None


def _fleet_layout(lab: LabHandle) -> dict[str, list[str]] | None:
    text = _fleet_file(lab, FLEET_LAYOUT)
    return None if text is None else dict(json.loads(text)["hosts"])


def _served(url: str) -> float:
    try:
        return scrape_metrics(url).get("vllm:request_success_total", 0.0)
    except OSError:
        return 0.0


def _at_drain(out: str) -> int:
    line = next(ln for ln in out.splitlines() if "at the drain" in ln)
    return int(line.split()[0])


@pytest.fixture
def long_prompts(lab: LabHandle) -> Iterator[None]:
    """The gateways at the long-prompts stage for the test, then back at colocated (what later tests
    expect), after the explicit reset of the layout if the test failed before its own."""
    assert _fleet_layout(lab) is None, f"lab-gw:{FLEET_LAYOUT}: an earlier run left a live layout"
    # every role, not the gateway's only: the plain provision after the moves must find nothing else to do
    _ok("provision", "--profile", PROFILE, "--stage", "long-prompts")
    yield
    if _fleet_layout(lab) is not None:  # a failed move: the reset, so later tests find lab-cross's layout
        _ok("provision", "--profile", PROFILE, "--layout-from-inventory")
    _ok("provision", "--profile", PROFILE, "--roles", "gateway", "--stage", "colocated")


@pytest.fixture
def traffic(long_prompts: None) -> Iterator[dict[str, Any]]:
    """Three short streams and two long ones at a time until the test ends; every failure kept."""
    env = {}
    for line in _ok("lab.env").splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = value.strip("'\"")
    base = urlsplit(env["OPENAI_BASE_URL"])
    host, port, key = base.hostname or "", base.port or 443, env["OPENAI_API_KEY"]
    tls = client_context(env.get("SSL_CERT_FILE"))  # lab-cross is on TLS: the lab CA lab.env exports
    stop = threading.Event()
    seen: dict[str, Any] = {"ok": 0, "failed": []}
    rng = random.Random(35)

    async def worker(long: bool) -> None:
        client = StreamClient(host, port, tls=tls)
        try:
            for n in itertools.count():
                if stop.is_set():
                    return
                prompt = words(LONG_TOKENS if long else 16, rng)
                tokens = 300 if long else 500
                body = completion_body(prompt, tokens, MODEL, usage=True)
                rec = Record(n, "", "long" if long else "short", 0, tokens)
                request = request_bytes(host, port, "/v1/completions", body, key=key)
                await client.run(request, rec)
                if rec.success:
                    seen["ok"] += 1
                else:
                    seen["failed"].append(rec.error or f"HTTP {rec.status}")
        finally:
            client.close()

    async def all_workers() -> None:
        await asyncio.gather(*(worker(True) for _ in range(2)), *(worker(False) for _ in range(3)))

    thread = threading.Thread(target=asyncio.run, args=(all_workers(),), daemon=True)
    thread.start()

    def stopped() -> None:
        stop.set()
        thread.join(120)

    seen["stop"] = stopped
    yield seen
    stopped()


def _move(host: str, to: str, why: str) -> str:
    out = _ok("rebalance", "--profile", PROFILE, "--host", host, "--to", to, "--wait", "60", "--reason", why)
    assert "[5/5] admit" in out and "still in" not in out and "still holds" not in out, out
    return out


def test_a_colocated_host_moves_to_decode_then_a_decode_host_to_prefill_under_traffic(
    lab: LabHandle, traffic: dict[str, Any], tmp_path: Path
) -> None:
    started = time.monotonic()
    assert DECODE_URL not in _router_workers(lab) and COLOCATED_URL in _policy_colocated(lab)
    _wait(lambda: traffic["ok"] >= 6, 60, "traffic to flow")

    out = _move(HOST, "decode", "lab test: decode is short of KV")
    assert _at_drain(out) >= 1, out  # streams were in flight on the host, and finished (0 failed below)
    assert (_fleet_layout(lab) or {}).get(HOST) == ["decode"]
    assert DECODE_URL in _router_workers(lab) and _policy_colocated(lab) == ["http://198.18.0.11:8000"]
    _wait(lambda: _scraped_role(":8200") == "decode", 30, "Prometheus scraping lab-colo2 as decode")
    before = _served(DECODE_URL)
    _wait(lambda: _served(DECODE_URL) > before, 60, "the router sending long prompts to lab-colo2")

    out = _move("lab-d1", "prefill", "lab test: prefill queue is long")
    print(f"\nlab-d1 leg: {_at_drain(out)} P/D stream(s) in lab-d1 at its drain")
    assert _fleet_layout(lab) == {
        "lab-colo1": ["colocated"],
        "lab-colo2": ["decode"],
        "lab-p1": ["prefill"],
        "lab-d1": ["prefill"],
    }
    workers = _router_workers(lab)
    assert D1_PREFILL_URL in workers and D1_DECODE_URL not in workers and DECODE_URL in workers, workers
    _wait(lambda: _scraped_role(":8100", "lab-d1") == "prefill", 30, "Prometheus scraping lab-d1 as prefill")
    before = _served(D1_PREFILL_URL)
    _wait(lambda: _served(D1_PREFILL_URL) > before, 60, "the router sending prefills to lab-d1")

    report = tmp_path / "check.json"
    _ok("provision", "--profile", PROFILE, "--check", "--json", str(report))
    checked = json.loads(report.read_text())
    changes = {host: h["changes"] for host, h in checked["hosts"].items() if h["changes"] or h["error"]}
    assert checked["totals"]["changed"] == 0 and not changes, changes  # the fleet's layout, kept
    moves_s = time.monotonic() - started
    traffic["stop"]()
    assert not traffic["failed"], traffic["failed"][:5]

    _ok("provision", "--profile", PROFILE, "--layout-from-inventory")
    assert _fleet_layout(lab) is None  # the inventory's layout again
    workers = _router_workers(lab)
    assert D1_DECODE_URL in workers and DECODE_URL not in workers and D1_PREFILL_URL not in workers, workers
    assert COLOCATED_URL in _policy_colocated(lab)
    audit = [
        json.loads(ln)
        for ln in (_fleet_file(lab, FLEET_LAYOUT.replace(".json", ".audit.jsonl")) or "").splitlines()
    ]
    last = [(e["event"], e.get("to")) for e in audit][-3:]
    assert last == [("moved", "decode"), ("moved", "prefill"), ("reset", None)], last
    print(
        f"\nrebalance legs: {moves_s:.0f} s (two moves and the check), reset done at "
        f"{time.monotonic() - started:.0f} s, {traffic['ok']} streams ok, 0 failed"
    )

"""`invoke rebalance` on the lab (lab-cross, provisioned by the time this file runs), issue 35's legs under
steady streamed traffic with no failed request: lab-colo2 moves from the colocated pool to decode (its
drain finds streams in flight, and they finish), then lab-d1 from decode to prefill. After each move the
router, the gateway's policy and Prometheus (the new `role` label) serve the new layout and the moved host
serves requests; the layout is kept on the fleet (lab-gw, beside the live stage) with each move in its
audit log; a plain provision afterwards would change nothing (it reads the layout from the fleet). Then the
traffic stops and `invoke provision --layout-from-inventory` resets the fleet to lab-cross's layout.

lab-cross, not lab-16 (the issue's 16 hosts): lab-16 needs its own inventory booted (16 containers) and
provisioned, minutes beyond this file; the legs, the router and the drain are the same on four hosts.
test_lab_rebalance_16.py runs them on lab-16 (opt-in, PDFLEET_LAB_16=1; passed 12-03).

Traffic: the bench's streaming client through the gateway's one key and base URL, at the long-prompts
stage (short prompts stream from the colocated pool, long ones through the router to the P/D pool, with
the gateway's fallback to the colocated pool while the router restarts to take its new instance list):
three short streams and two long ones at a time, each long enough to be in flight at a drain.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lab.helpers import (
    LabHandle,
    StreamedTraffic,
    Streams,
    at_drain,
    gateway_policy,
    gateway_targets,
    invoke_ok,
    lab_deployment,
    prometheus_url,
    remote_file,
    router_workers,
    scraped_roles,
    served,
    wait_for,
)

PROFILE = "lab-cross"
MODEL = "llama-3.1-8b"
HOST, ADDRESS = "lab-colo2", "198.18.0.12"
DECODE_URL, COLOCATED_URL = f"http://{ADDRESS}:8200", f"http://{ADDRESS}:8000"
D1_DECODE_URL, D1_PREFILL_URL = "http://198.18.0.31:8200", "http://198.18.0.31:8100"
LONG_TOKENS = 8_750  # over the profile's 8192-token threshold: the long-prompts stage sends it to P/D
FLEET_LAYOUT = "/var/lib/pdfleet/layouts/lab-cross.json"  # on lab-gw, the inventory's gateway host


def _router_workers(lab: LabHandle) -> list[str]:
    router = lab_deployment(PROFILE).topology.gateways[0].router_url
    assert router is not None
    return router_workers(lab, "lab-gw", router)


def _policy_colocated(lab: LabHandle) -> list[str]:
    return list(gateway_policy(lab, "lab-gw", MODEL)["colocated"])


def _scraped(host: str) -> set[str] | None:
    """The `role` labels of a host's vLLM targets Prometheus scrapes up."""
    return scraped_roles(prometheus_url(PROFILE)).get(host)


def _fleet_layout(lab: LabHandle) -> dict[str, list[str]] | None:
    text = remote_file(lab, "lab-gw", FLEET_LAYOUT)
    return None if text is None else dict(json.loads(text)["hosts"])


@pytest.fixture
def long_prompts(lab: LabHandle) -> Iterator[dict[str, bool]]:
    """The gateways at the long-prompts stage for the test, then back at colocated (what later tests
    expect): by the test's own reset (`reset` set), else here, after the explicit reset of the layout if the
    test failed before its own."""
    assert _fleet_layout(lab) is None, f"lab-gw:{FLEET_LAYOUT}: an earlier run left a live layout"
    # every role, not the gateway's only: the plain provision after the moves must find nothing else to do
    invoke_ok("provision", "--profile", PROFILE, "--stage", "long-prompts")
    done = {"reset": False}
    yield done
    if done["reset"]:
        return
    if _fleet_layout(lab) is not None:  # a failed move: the reset, so later tests find lab-cross's layout
        invoke_ok("provision", "--profile", PROFILE, "--layout-from-inventory")
    invoke_ok("provision", "--profile", PROFILE, "--roles", "gateway", "--stage", "colocated")


@pytest.fixture
def traffic(long_prompts: dict[str, bool]) -> Iterator[StreamedTraffic]:
    """Three short streams and two long ones at a time until the test ends; every failure kept."""
    streams = StreamedTraffic(gateway_targets(PROFILE), Streams(MODEL, LONG_TOKENS)).start()
    yield streams
    streams.stop()


def _move(host: str, to: str, why: str) -> str:
    out = invoke_ok(
        "rebalance", "--profile", PROFILE, "--host", host, "--to", to, "--wait", "60", "--reason", why
    )
    assert "[5/5] admit" in out and "still in" not in out and "still holds" not in out, out
    return out


def test_a_colocated_host_moves_to_decode_then_a_decode_host_to_prefill_under_traffic(
    lab: LabHandle, long_prompts: dict[str, bool], traffic: StreamedTraffic, tmp_path: Path
) -> None:
    started = time.monotonic()
    assert DECODE_URL not in _router_workers(lab) and COLOCATED_URL in _policy_colocated(lab)
    wait_for(lambda: traffic.ok >= 6, 60, "traffic to flow")

    out = _move(HOST, "decode", "lab test: decode is short of KV")
    assert at_drain(out) >= 1, out  # streams were in flight on the host, and finished (0 failed below)
    assert (_fleet_layout(lab) or {}).get(HOST) == ["decode"]
    assert DECODE_URL in _router_workers(lab) and _policy_colocated(lab) == ["http://198.18.0.11:8000"]
    wait_for(lambda: _scraped(HOST) == {"decode"}, 30, "Prometheus scraping lab-colo2 as decode")
    before = served(DECODE_URL)
    wait_for(lambda: served(DECODE_URL) > before, 60, "the router sending long prompts to lab-colo2")

    out = _move("lab-d1", "prefill", "lab test: prefill queue is long")
    print(f"\nlab-d1 leg: {at_drain(out)} P/D stream(s) in lab-d1 at its drain")
    assert _fleet_layout(lab) == {
        "lab-colo1": ["colocated"],
        "lab-colo2": ["decode"],
        "lab-p1": ["prefill"],
        "lab-d1": ["prefill"],
    }
    workers = _router_workers(lab)
    assert D1_PREFILL_URL in workers and D1_DECODE_URL not in workers and DECODE_URL in workers, workers
    wait_for(lambda: _scraped("lab-d1") == {"prefill"}, 30, "Prometheus scraping lab-d1 as prefill")
    before = served(D1_PREFILL_URL)
    wait_for(lambda: served(D1_PREFILL_URL) > before, 60, "the router sending prefills to lab-d1")

    report = tmp_path / "check.json"
    invoke_ok("provision", "--profile", PROFILE, "--check", "--json", str(report))
    checked = json.loads(report.read_text())
    changes = {host: h["changes"] for host, h in checked["hosts"].items() if h["changes"] or h["error"]}
    assert checked["totals"]["changed"] == 0 and not changes, changes  # the fleet's layout, kept
    moves_s = time.monotonic() - started
    traffic.stop()
    assert not traffic.failed, traffic.failed[:5]

    # the reset, and the colocated stage later tests expect, in one provision
    invoke_ok("provision", "--profile", PROFILE, "--layout-from-inventory", "--stage", "colocated")
    long_prompts["reset"] = True
    assert _fleet_layout(lab) is None  # the inventory's layout again
    workers = _router_workers(lab)
    assert D1_DECODE_URL in workers and DECODE_URL not in workers and D1_PREFILL_URL not in workers, workers
    assert COLOCATED_URL in _policy_colocated(lab)
    audit_log = remote_file(lab, "lab-gw", FLEET_LAYOUT.replace(".json", ".audit.jsonl")) or ""
    audit = [json.loads(ln) for ln in audit_log.splitlines()]
    last = [(e["event"], e.get("to")) for e in audit][-3:]
    assert last == [("moved", "decode"), ("moved", "prefill"), ("reset", None)], last
    print(
        f"\nrebalance legs: {moves_s:.0f} s (two moves and the check), reset done at "
        f"{time.monotonic() - started:.0f} s, {traffic.ok} streams ok, 0 failed"
    )

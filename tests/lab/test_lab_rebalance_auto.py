"""The rollout controller's automatic rebalance on the lab (issue 35), opt-in: skipped unless
PDFLEET_LAB_AUTO=1 (some two minutes for the dry run: a move by hand, the controller re-provisioned twice, a
burst; some four more for the moving leg, see its test).

lab-cross has one decode host, which its minimum keeps, so lab-colo2 is first moved to decode by hand; the
controller (the rollout role on lab-gw) is provisioned with lab-cross-auto (lab-cross with
`rollout.rebalance.mode: dry-run` and lab-sized bands and times). A burst of long prompts through the gateway
at the long-prompts stage queues on the one prefill instance while the decode instances, with short outputs,
keep room: within the reaction time the controller records one proposal, decode -> prefill, with the figures
behind it (prefill queue P95 past its band's high), and nothing changes (dry run: the layout, the router's
workers). No second proposal follows during the cool-down (no flap back) after the burst. Then everything goes
back: the controller with lab-cross, the inventory's layout, the colocated stage.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from pdfleet.bench.client import Record, StreamClient, request_bytes
from pdfleet.bench.workloads import completion_body, words
from pdfleet.gateway.tls import client_context
from tests.lab.helpers import REPO_ROOT, LabHandle

pytestmark = pytest.mark.skipif(
    os.environ.get("PDFLEET_LAB_AUTO") != "1", reason="opt-in (~2 min): PDFLEET_LAB_AUTO=1 runs it"
)

INVOKE = [sys.executable, "-m", "invoke"]
PROFILE, AUTO, AUTO_ON = "lab-cross", "lab-cross-auto", "lab-cross-auto-on"
MODEL = "llama-3.1-8b"
LONG_TOKENS = 8_750  # over the 8192-token threshold: P/D at the long-prompts stage
BURST = 8  # long prompts at once on one prefill instance
EVENT = "rebalance-proposal"
FLEET_LAYOUT = "/var/lib/pdfleet/layouts/lab-cross.json"
LAYOUTS = "/var/lib/pdfleet/layouts"
COOLDOWN_S = 150  # profiles/lab-cross-auto.yml's (and so lab-cross-auto-on's)


def _ok(*args: str, timeout: float = 600) -> str:
    proc = subprocess.run(
        [*INVOKE, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout


def _proposals(profile: str = AUTO) -> list[dict[str, Any]]:
    out = _ok("rollout.history", "--profile", profile, "--last", "200")
    events = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
    return [e for e in events if e.get("event") == EVENT]


def _cooled_down(profile: str) -> list[dict[str, Any]]:
    """The controller's proposals, once the last one's cool-down (read back from its audit log whatever its
    mode, so an earlier run's holds this one's) has ended."""
    proposals = _proposals(profile)
    if proposals:
        time.sleep(max(0.0, proposals[-1]["at"] + COOLDOWN_S + 1 - time.time()))
    return proposals


def _gw_file(lab: LabHandle, path: str) -> str | None:
    """A file on lab-gw (None: absent)."""
    gw = next(h for h in lab.hosts if h.name == "lab-gw")
    rc, out, err = lab.ssh(gw, f"sudo -n sh -c '[ -e {path} ] || exit 3; cat {path}'")
    assert rc in (0, 3), err
    return None if rc == 3 else out


def _fleet_layout(lab: LabHandle, path: str = FLEET_LAYOUT) -> dict[str, list[str]] | None:
    text = _gw_file(lab, path)
    return None if text is None else dict(json.loads(text)["hosts"])


@pytest.fixture
def auto(lab: LabHandle) -> Iterator[None]:
    """Two decode hosts, the long-prompts stage, the controller in dry run; then all of it back."""
    assert _fleet_layout(lab) is None, f"lab-gw:{FLEET_LAYOUT}: an earlier run left a live layout"
    try:
        _ok("provision", "--profile", PROFILE, "--roles", "gateway", "--stage", "long-prompts")
        _ok(
            "rebalance",
            "--profile",
            PROFILE,
            "--host",
            "lab-colo2",
            "--to",
            "decode",
            "--wait",
            "30",
            "--reason",
            "auto lab test: a second decode host to give",
        )
        _ok("provision", "--profile", AUTO, "--roles", "rollout", "--limit", "lab-gw")
        yield
    finally:
        _ok("provision", "--profile", PROFILE, "--roles", "rollout", "--limit", "lab-gw")
        if _fleet_layout(lab) is not None:
            _ok("provision", "--profile", PROFILE, "--layout-from-inventory")
        _ok("provision", "--profile", PROFILE, "--roles", "gateway", "--stage", "colocated")


def _burst(seconds: float) -> dict[str, Any]:
    """BURST long prompts at a time through the gateway for `seconds`; what came back."""
    env = {}
    for line in _ok("lab.env").splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = value.strip("'\"")
    base = urlsplit(env["OPENAI_BASE_URL"])
    host, port, key = base.hostname or "", base.port or 443, env["OPENAI_API_KEY"]
    tls = client_context(env.get("SSL_CERT_FILE"))
    seen: dict[str, Any] = {"ok": 0, "failed": []}
    rng = random.Random(351)
    end = time.monotonic() + seconds

    async def worker(n: int) -> None:
        client = StreamClient(host, port, tls=tls)
        try:
            while time.monotonic() < end:
                # each prompt its own first word: a decode instance caches the KV it pulled
                body = completion_body(f"burst{n}-{rng.random()} " + words(LONG_TOKENS, rng), 16, MODEL)
                rec = Record(n, "", "long", 0, 16)
                await client.run(request_bytes(host, port, "/v1/completions", body, key=key), rec)
                if rec.success:
                    seen["ok"] += 1
                else:
                    seen["failed"].append(rec.error or f"HTTP {rec.status}")
        finally:
            client.close()

    async def all_workers() -> None:
        await asyncio.gather(*(worker(n) for n in range(BURST)))

    thread = threading.Thread(target=asyncio.run, args=(all_workers(),), daemon=True)
    thread.start()
    seen["thread"] = thread
    return seen


def test_a_burst_of_long_prompts_gets_one_dry_run_proposal_toward_prefill_and_no_flap_back(
    lab: LabHandle, auto: None
) -> None:
    before = len(_cooled_down(AUTO))
    layout = _fleet_layout(lab)
    started, wall = time.monotonic(), time.time()
    burst = _burst(30)
    deadline = started + 60
    new: list[dict[str, Any]] = []
    while time.monotonic() < deadline and not new:
        time.sleep(2)
        new = _proposals()[before:]
    reaction = time.monotonic() - started
    assert new, "no proposal within 60 s of the burst"
    first = new[0]
    assert (first["from"], first["to"], first["mode"]) == ("decode", "prefill", "dry-run"), first
    figures = first["figures"]
    assert figures["prefill_queue_p95_ms"] > 400 and figures["hosts"]["decode"] == 2, figures
    assert first["at"] >= wall
    burst["thread"].join(60)
    time.sleep(10)  # after the burst: the prefill queue falls; the cool-down holds any other proposal
    assert len(_proposals()) == before + 1, _proposals()[before:]
    assert _fleet_layout(lab) == layout  # dry run: nothing moved
    assert not burst["failed"], burst["failed"][:5]
    print(
        f"\nauto rebalance (dry run): proposal {first['from']} -> {first['to']} {reaction:.0f} s after the "
        f"burst began ({first['why']}); {burst['ok']} long prompts ok, 0 failed"
    )


@pytest.fixture
def auto_on(lab: LabHandle) -> Iterator[None]:
    """The fleet under lab-cross-auto-on (the controller's proposals to carry out) with two decode hosts at
    the long-prompts stage; then the inventory's layout and lab-cross's renders on lab-gw again."""
    for profile in (PROFILE, AUTO_ON):
        path = f"{LAYOUTS}/{profile}.json"
        assert _fleet_layout(lab, path) is None, f"lab-gw:{path}: an earlier run left a live layout"
    front = ("--roles", "gateway,monitoring,rollout", "--limit", "lab-gw")
    try:
        _ok("provision", "--profile", AUTO_ON, *front, "--stage", "long-prompts")
        why = "auto lab test: a second decode host to give"
        _ok(
            "rebalance",
            "--profile",
            AUTO_ON,
            "--host",
            "lab-colo2",
            "--to",
            "decode",
            "--wait",
            "30",
            "--reason",
            why,
        )
        yield
    finally:
        if _fleet_layout(lab, f"{LAYOUTS}/{AUTO_ON}.json") is not None:
            _ok("provision", "--profile", AUTO_ON, "--layout-from-inventory")
        _ok("provision", "--profile", PROFILE, *front, "--stage", "colocated")


def _figures(profile: str, window_s: float) -> dict[str, Any]:
    from dataclasses import asdict

    from pdfleet.metrics.prometheus import PrometheusClient
    from pdfleet.rollout.pressure import read_figures
    from tests.lab.helpers import prometheus_url

    return asdict(read_figures(PrometheusClient(prometheus_url(profile)), window_s))


def test_mode_on_moves_one_host_toward_prefill_the_queue_falls_and_nothing_flaps_back(
    lab: LabHandle, auto_on: None, tmp_path: Any
) -> None:
    """The Done-when: a burst of long prompts overloads the one prefill instance; the controller proposes
    decode -> prefill (mode on), `invoke rebalance --follow` carries it out (one decode host moved, gated),
    the prefill queue P95 falls, no other proposal or move follows, and no request fails."""
    proposals = _cooled_down(AUTO_ON)
    before = len(proposals)
    audit_path = f"{LAYOUTS}/{AUTO_ON}.audit.jsonl"
    audit_before = len((_gw_file(lab, audit_path) or "").splitlines())
    log = (tmp_path / "follow.log").open("w")
    follower = subprocess.Popen(
        [*INVOKE, "rebalance", "--profile", AUTO_ON, "--follow", "2", "--wait", "30"],
        cwd=REPO_ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    started, wall = time.monotonic(), time.time()
    try:
        burst = _burst(110)
        moved: list[dict[str, Any]] = []
        while time.monotonic() < started + 100 and not moved:
            time.sleep(3)
            events = [json.loads(ln) for ln in (_gw_file(lab, audit_path) or "").splitlines()[audit_before:]]
            moved = [e for e in events if e.get("event") in ("moved", "proposal-stopped", "proposal-failed")]
        moved_after = time.monotonic() - started
        time.sleep(max(0.0, started + 100 - time.monotonic()))  # the burst's last seconds on the new layout
        after = _figures(AUTO_ON, 10)
        burst["thread"].join(60)
    finally:
        follower.send_signal(2)  # Ctrl-C: the loop stops between looks
        follower.wait(60)
        log.close()
    out = (tmp_path / "follow.log").read_text()
    events = [json.loads(ln) for ln in (_gw_file(lab, audit_path) or "").splitlines()[audit_before:]]
    new = _proposals(AUTO_ON)[before:]
    said = f"\nfollower said:\n{out[-4000:]}\naudit: {json.dumps(events)}"
    assert len(new) == 1, f"{new}{said}"  # one proposal, no flap back in the cool-down
    first = new[0]
    assert (first["from"], first["to"], first["mode"]) == ("decode", "prefill", "on"), first
    assert first["at"] >= wall
    kinds = [e["event"] for e in events]
    assert kinds == ["proposal-taken", "moved"], said
    taken, done = events
    assert taken["proposal"] == done["proposal"] == f"{first['at']:.3f}"
    assert (done["from"], done["to"]) == ("decode", "prefill"), done
    layout = _fleet_layout(lab, f"{LAYOUTS}/{AUTO_ON}.json")
    assert layout is not None and layout[done["host"]] == ["prefill"], layout
    q_before, q_after = first["figures"]["prefill_queue_p95_ms"], after["prefill_queue_p95_ms"]
    assert q_after is not None and q_after < q_before, (q_before, after)
    assert after["hosts"]["prefill"] == 2, after
    assert not burst["failed"], burst["failed"][:5]
    print(
        f"\nauto rebalance (on): proposal {first['at'] - wall:.0f} s after the burst began; "
        f"{done['host']} moved to prefill {taken['at'] - first['at']:.1f} s after it was proposed (took "
        f"{sum(done['seconds'].values()):.1f} s: {done['seconds']}; gates: {done['gates']}); moved "
        f"{moved_after:.0f} s into the burst; prefill queue P95 {q_before:.0f} -> {q_after:.0f} ms; "
        f"{burst['ok']} long prompts ok, 0 failed; follower said:\n{out[-1500:]}"
    )

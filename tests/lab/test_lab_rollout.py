"""`invoke rollout` on the lab (lab-cross): the controller on lab-gw walks long prompts to the
disaggregated pool step by step with traffic running, rolls back by itself on a fault, keeps going when
the operator's process is killed, and a plain provision leaves its stage alone; abort, promote, promote
--full, a dry run and an inconclusive pause each do what they say.

Traffic: the bench's load generator (its streaming client and random-word prompts) through the
gateway's one key and base URL, one stream of long prompts and one of short ones. The long ones take
the sticky buckets 0..99 in an order that keeps any 22 in a row within 5% of each step's share (not a
coin's luck). One at a time, because the lab's P/D pool has one prefill GPU against the colocated
pool's two: two long prompts at once queue on it, and the TTFT gate (2x the colocated pool's P99) then
rolls back, rightly, on a load the lab's pool is not sized for.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pdfleet.bench.client import Record, StreamClient, request_bytes
from pdfleet.bench.workloads import completion_body, words
from pdfleet.gateway.policy import bucket_of
from pdfleet.gateway.tls import client_context
from pdfleet.lab.paths import LabPaths
from pdfleet.model.profile_loader import load_profile
from tests.lab.helpers import (
    REPO_ROOT,
    LabHandle,
    gateway_open,
    gateway_url,
    lab_deployment,
    prometheus_url,
    sdk_verify,
)

INVOKE = [sys.executable, "-m", "invoke"]
PROFILE = "lab-cross"
MODEL = "llama-3.1-8b"
LONG_TOKENS = 8_750  # the bench's random-word prompt of that many tokens (chars/4): just over 8192, long
GATEWAY_URL = gateway_url(PROFILE)  # the topology's: https, lab-cross is on TLS (the lab CA)
GATEWAY_METRICS = GATEWAY_URL + "/metrics"
ROLLBACK_S = 5.0
# the gates' window: a test's figures stay in it after the test. Healthy figures are what the next test
# would see anyway; a fault's (errors, fallbacks, a cold decode instance) are waited out, and so is all
# traffic before the test that needs an empty window
WINDOW_S = load_profile(PROFILE, REPO_ROOT / "profiles").rollout.window_s


def _invoke(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*INVOKE, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )


def _ok(*args: str, timeout: float = 900) -> str:
    proc = _invoke(*args, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def _wait(check: Callable[[], Any], timeout: float, what: str, every: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"{what} did not happen within {timeout:g} s")


def _host(lab: LabHandle, name: str):  # noqa: ANN202 - LabHost
    return next(h for h in lab.hosts if h.name == name)


def _remote(lab: LabHandle, *args: str) -> Any:
    """pdfleet-rollout on lab-gw as the service user; its JSON answer."""
    cmd = (
        "sudo -n -u pdfleet /opt/pdfleet/rollout/bin/pdfleet-rollout --config "
        "/etc/pdfleet/rollout/controller.json " + " ".join(args)
    )
    rc, out, err = lab.ssh(_host(lab, "lab-gw"), cmd)
    assert rc == 0, err
    return json.loads(out) if args[0] != "history" else [json.loads(x) for x in out.splitlines() if x]


def _status(lab: LabHandle) -> dict[str, Any]:
    """lab-cross's one model's status (pdfleet-rollout status lists every model's)."""
    (status,) = _remote(lab, "status")["models"]
    return dict(status)


def _active(
    lab: LabHandle, done: Callable[[dict[str, Any]], bool], timeout: float, what: str
) -> dict[str, Any]:
    """The status once `done` holds; a rollout that ends some other way fails at once, with its reason."""

    def check() -> dict[str, Any] | None:
        status = _status(lab)
        if done(status):
            return status
        assert status["phase"] in ("progressing", "paused"), (what, status["phase"], status.get("reason"))
        return None

    return dict(_wait(check, timeout, what))


def _decisions() -> dict[tuple[str, str], float]:
    """The gateway's routing decisions of long prompts per (stage, pool)."""
    text = gateway_open(GATEWAY_METRICS).decode()
    out: dict[tuple[str, str], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "pdfleet_gateway_routing_decisions_total" and s.labels["length_class"] == "long":
                key = (s.labels["stage"], s.labels["pool"])
                out[key] = out.get(key, 0.0) + s.value
    return out


def _gateway_metrics() -> list[Any]:
    return list(text_string_to_metric_families(gateway_open(GATEWAY_METRICS).decode()))


def _served() -> tuple[int, str]:
    """The policy version and stage the gateway serves now, from its own metrics (not the controller's
    word: a controller that decides but does not push is seen here)."""
    for fam in _gateway_metrics():
        for s in fam.samples:
            if s.name == "pdfleet_gateway_policy_info":
                return int(s.labels["version"]), s.labels["stage"]
    raise AssertionError("the gateway publishes no pdfleet_gateway_policy_info")


def _prometheus_fallbacks() -> float:
    """Every fallback Prometheus holds for the gateway (0 before the first: a counter that never moved
    is absent): a breach the gates can measure is one Prometheus has scraped."""
    import urllib.parse
    import urllib.request

    query = urllib.parse.urlencode({"query": "sum(pdfleet_gateway_fallbacks_total)"})
    with urllib.request.urlopen(f"{prometheus_url(PROFILE)}/api/v1/query?{query}", timeout=5) as resp:
        result = json.loads(resp.read())["data"]["result"]
    return float(result[0]["value"][1]) if result else 0.0


def _warm_disagg(env: dict[str, str], timeout: float = 60) -> None:
    """Streams forced to the disaggregated pool until three in a row answer from it: a restarted
    instance's first requests are not the figures the next test should be gated on."""
    client = openai.OpenAI(
        base_url=env["OPENAI_BASE_URL"],
        api_key=env["OPENAI_API_KEY"],
        max_retries=0,
        timeout=60,
        http_client=openai.DefaultHttpxClient(verify=sdk_verify(env)),
    )
    deadline, served = time.monotonic() + timeout, 0
    while served < 3:
        assert time.monotonic() < deadline, "the disaggregated pool did not serve again"
        try:
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL,
                messages=[{"role": "user", "content": "warm up"}],
                max_tokens=4,
                stream=True,
                extra_headers={"X-Pdfleet-Pool": "disagg"},
            )
            for _ in raw.parse():
                pass
            served = served + 1 if raw.headers.get("X-Pdfleet-Pool") == "disagg" else 0
        except openai.APIError:  # still starting: the gateway answers 503 for a forced pool that is down
            served = 0
        time.sleep(0.5)


def _session_per_bucket() -> list[str]:
    """A session id per sticky bucket 0..99, as the gateway buckets its `X-Session-Id`."""
    out: dict[int, str] = {}
    for i in itertools.count():
        out.setdefault(bucket_of(f"s:long-{i}"), f"long-{i}")
        if len(out) == 100:
            return [out[b] for b in range(100)]
    raise AssertionError("unreachable")


def _spread(turn: int) -> int:
    """The bucket of a turn, ordered so that any 22 turns in a row hold each step's share within 5%:
    buckets 0-24 every 4th turn (25%), 0-49 two turns in 4 (50%), 0-9 two turns in 20 (10%)."""
    return (turn % 4) * 25 + ((2 * (turn // 4)) % 5) * 5 + (turn // 20) % 5


@pytest.fixture(scope="module")
def last_traffic() -> dict[str, float]:
    """When the previous test's traffic ended ("at"), and whether its window holds a fault ("fault": 1).
    At the module's start the previous module's requests count as one (the session runs this file after
    the KV-alert test, whose forced P/D streams span a restart of the P/D pool): the first test waits
    them out of the gates' window. Taken before the module's provision, which sends no client request:
    the provision runs inside that wait instead of before it."""
    return {"at": time.time(), "fault": 1.0}


@pytest.fixture(scope="module")
def provisioned(
    lab: LabHandle, tmp_path_factory: pytest.TempPathFactory, last_traffic: dict[str, float]
) -> dict[str, str]:
    """lab-cross provisioned (the controller included); the client environment of `invoke lab.env`."""
    report = tmp_path_factory.mktemp("rollout") / "provision.json"
    _ok("provision", "--profile", PROFILE, "--json", str(report))
    env = {}
    for line in _ok("lab.env").splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = value.strip("'\"")
    return env


@pytest.fixture
def warmed(provisioned: dict[str, str]) -> None:
    """The disaggregated pool warmed before the walk. Unwarmed, the walk's first step (3 samples, its P99
    their maximum) gated on the P/D pool's first request after an earlier test restarted it: 690 ms against
    the colocated pool's 293 ms in one CI run. Here, not in the module's provision: the inconclusive test
    before the walk needs a window without requests, and the warm-up's short streams (forced to the P/D
    pool, no routing decision of a long prompt) stay out of the walk's samples."""
    _warm_disagg(provisioned)


def _wait_out_window(last_traffic: dict[str, float]) -> None:
    """Sleep until the gates' window holds none of the previous test's requests."""
    time.sleep(max(0.0, last_traffic["at"] + WINDOW_S + 2 - time.time()))
    last_traffic["fault"] = 0.0


@pytest.fixture
def traffic(provisioned: dict[str, str], last_traffic: dict[str, float]) -> Iterator[dict[str, Any]]:
    """The bench's load generator (`pdfleet.bench`: its streaming client, its random-word prompts) until
    the test ends: one stream of long documents, one of short turns, each request with its session;
    every failed request is kept (fallbacks are not failures: the client sees a whole stream)."""
    base = urlsplit(provisioned["OPENAI_BASE_URL"])
    host, port, key = base.hostname or "", base.port or 443, provisioned["OPENAI_API_KEY"]
    tls = client_context(provisioned.get("SSL_CERT_FILE"))  # the lab CA lab.env exports (https)
    stop = threading.Event()
    seen: dict[str, Any] = {"sent": 0, "failed": [], "failed_started": []}
    sessions, turn, rng = _session_per_bucket(), itertools.count(), random.Random(15)

    async def worker(long: bool) -> None:
        client = StreamClient(host, port, tls=tls)
        try:
            for n in itertools.count():
                if stop.is_set():
                    return
                session = sessions[_spread(next(turn))] if long else f"short-{n}"
                body = completion_body(words(LONG_TOKENS if long else 8, rng), 16, MODEL, usage=True)
                rec = Record(n, "", "long" if long else "short", 0, 16)
                headers = {"X-Session-Id": session}
                request = request_bytes(host, port, "/v1/completions", body, key=key, headers=headers)
                started = time.monotonic()
                await client.run(request, rec)
                if rec.success:
                    seen["sent"] += 1
                else:
                    seen["failed"].append(rec.error or f"HTTP {rec.status}")
                    seen["failed_started"].append(started)
        finally:
            client.close()

    async def both() -> None:
        # one long stream at a time: the lab's P/D pool has one prefill GPU
        await asyncio.gather(worker(True), worker(False))

    thread = threading.Thread(target=asyncio.run, args=(both(),), daemon=True)
    thread.start()
    yield seen
    stop.set()
    thread.join(180)
    last_traffic["at"] = time.time()


def _stage_colocated() -> None:
    """The gateway set to its colocated stage through its admin API (as a rollout step or the decider's lab
    test sets a stage), a version above the one it serves: the controller adopts it. Was a provision of the
    gateway role with --stage colocated (~5 s, twice a module)."""
    key = LabPaths().gateway_admin_key.read_text().strip()

    def admin(path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(GATEWAY_URL + path, data=data, method="POST" if data else "GET")
        request.add_header("Authorization", f"Bearer {key}")
        request.add_header("Content-Type", "application/json")
        return dict(json.loads(gateway_open(request)))

    policy = admin("/admin/policy")
    stages = policy["stages"]
    admin("/admin/stage", {"version": policy["version"] + 1, "stage": "colocated", "stages": stages})


@pytest.fixture
def at_colocated(provisioned: dict[str, str], lab: LabHandle, last_traffic: dict[str, float]) -> None:
    """Each test starts from the colocated stage with no rollout active, and a window that holds no
    fault of the previous test."""
    if _status(lab)["phase"] in ("progressing", "paused", "inconclusive", "halted"):
        _ok("rollout.abort")
        _wait(lambda: _status(lab)["phase"] == "aborted", 30, "the abort")
    if _status(lab)["stage"] != "colocated":
        _stage_colocated()
        _wait(lambda: _status(lab)["stage"] == "colocated", 30, "the controller adopting colocated")
    if last_traffic["fault"]:
        _wait_out_window(last_traffic)


def test_too_little_traffic_pauses_inconclusive_says_why_and_promote_full_ends_it(
    lab: LabHandle, at_colocated: None, last_traffic: dict[str, float]
) -> None:
    # no traffic fixture, and a window that holds no earlier request: the first analysis never sees
    # its minimum samples. It runs first: the window the previous module's requests are waited out of
    # serves it, and it sends nothing, so the walk after it starts on an empty window without a wait.
    _wait_out_window(last_traffic)
    _ok("rollout", "--stage", "long-prompts", "--no-watch")
    status = _wait(
        lambda: (s := _status(lab))["phase"] == "inconclusive" and s, 120, "the inconclusive pause"
    )
    assert "too little traffic" in status["reason"]
    assert "inconclusive" in _ok("rollout.status")
    # promote --full skips every remaining step: the target's full weights at once (two analyses are
    # left in the plan, each wanting 10 samples this test never sends, so succeeding is the promotion)
    _ok("rollout.promote", "--full")
    done = _wait(lambda: (s := _status(lab))["phase"] == "succeeded" and s, 15, "the full promotion")
    assert (done["stage"], done["weights"]["long"]) == ("long-prompts", 100), done


def test_rollout_walks_every_step_to_100_percent_by_itself_with_no_failed_request(
    lab: LabHandle, at_colocated: None, warmed: None, traffic: dict[str, Any]
) -> None:
    """The operator's process follows the rollout and is killed in its first step: the controller walks
    every step by itself, with each step's share of long prompts on the disaggregated pool, no failed
    request, and a plain provision afterwards keeps the stage it reached."""
    before = _decisions()
    watcher = subprocess.Popen(
        [*INVOKE, "rollout", "--stage", "long-prompts"],
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _wait(lambda: _status(lab)["phase"] == "progressing", 60, "the rollout started")
    watcher.send_signal(signal.SIGKILL)
    watcher.wait(30)
    killed_at = _status(lab)["step_index"]
    assert killed_at <= 1, killed_at  # killed in the first step (10%) or its analysis
    status = _active(lab, lambda s: s["phase"] == "succeeded", 400, "the controller walking by itself")
    walked = (status["phase"], status["stage"], status["weights"]["long"])
    assert walked == ("succeeded", "long-prompts", 100), (status.get("reason"), status.get("last_results"))
    history = _remote(lab, "history")
    applied = [e for e in history if e["event"] == "applied"]
    assert [e["weights"]["long"] for e in applied][-4:] == [10, 50, 100, 100]
    # each step's share of long prompts on the disaggregated pool, from the gateway's decision counters
    decisions = {k: v - before.get(k, 0.0) for k, v in _decisions().items()}
    for step, weight in ((0, 10), (2, 50), (4, 100)):
        stage = f"long-prompts@{step}"
        total = decisions.get((stage, "disagg"), 0) + decisions.get((stage, "colocated"), 0)
        assert total > 0, stage
        share = 100 * decisions.get((stage, "disagg"), 0) / total
        assert abs(share - weight) <= 5, f"{stage}: {share:.1f}% on disagg, wanted {weight}%"
    assert traffic["failed"] == [], traffic["failed"][:3]
    _ok("provision", "--profile", PROFILE)
    after = _status(lab)
    assert (after["stage"], after["version"]) == (status["stage"], status["version"])
    assert "long-prompts" in _ok("rollout.status")
    _the_controller_walked_over_tls_with_a_stage_only_key(lab)


def _controller_key_file() -> str:
    """Where the rollout role puts the controller's gateway key on its host (the topology's)."""
    controller = lab_deployment(PROFILE).topology.controller
    assert controller is not None
    return controller.key_file


def _the_controller_walked_over_tls_with_a_stage_only_key(lab: LabHandle) -> None:
    """The walk's calls went over HTTPS, verified against the lab CA, with the controller's key: a key that
    sets the stage and reads the policy (and the shadow a plan's step sets), and is refused (403) on every
    other admin call and on the client API; the admin key is not on the controller's host."""
    rc, raw, err = lab.ssh(_host(lab, "lab-gw"), "sudo -n cat /etc/pdfleet/rollout/controller.json")
    assert rc == 0, err
    config = json.loads(raw)
    assert [g["admin_url"] for g in config["gateways"]] == [GATEWAY_URL], config["gateways"]
    assert config["gateway_ca_file"] == "/etc/pdfleet/tls/gateway-ca.crt"
    rc, key, err = lab.ssh(_host(lab, "lab-gw"), f"sudo -n cat {_controller_key_file()}")
    assert rc == 0, err
    key = key.strip()
    assert key and key != LabPaths().gateway_admin_key.read_text().strip(), (
        "the controller holds the admin key"
    )

    def status(method: str, path: str) -> int:
        request = urllib.request.Request(
            GATEWAY_URL + path, method=method, data=b"{}" if method == "POST" else None
        )
        request.add_header("Authorization", f"Bearer {key}")
        request.add_header("Content-Type", "application/json")
        try:
            gateway_open(request)
        except urllib.error.HTTPError as err:
            return err.code
        return 200

    assert status("GET", "/admin/policy") == 200 and status("GET", "/admin/shadow") == 200
    # the gateway's other admin routes (pdfleet/gateway/app.py) and the client API: refused for its scope
    refused = {
        (m, p): status(m, p)
        for m, p in (("POST", "/admin/reload"), ("GET", "/admin/keys"), ("GET", "/v1/models"))
    }
    assert set(refused.values()) == {403}, refused


def test_abort_goes_back_within_5_s_with_prometheus_hung_and_promote_ends_a_pause(
    lab: LabHandle, at_colocated: None, traffic: dict[str, Any]
) -> None:
    _ok("rollout", "--stage", "canary-long", "--no-watch")  # lab-cross: its third step is a pause
    _active(lab, lambda s: s["phase"] == "paused", 180, "the pause of canary-long")
    _ok("rollout.promote")
    _wait(lambda: _status(lab)["step_index"] >= 3, 30, "the step after the pause")
    # the emergency stop when monitoring is broken: Prometheus accepts connections and never answers
    gw = _host(lab, "lab-gw")
    rc, _, err = lab.ssh(gw, "sudo systemctl kill --signal=SIGSTOP prometheus.service")
    assert rc == 0, err
    try:
        time.sleep(1.5)  # a tick is now waiting on Prometheus
        started = time.monotonic()
        aborting = _invoke("rollout.abort", timeout=60)  # not refused: no tick holds the state's lock
        assert aborting.returncode == 0, aborting.stderr
        version, stage = _wait(
            lambda: (got := _served())[1] == "colocated" and got,
            10,
            "the gateway back on colocated",
            every=0.1,
        )
        served_at, took = time.time(), time.monotonic() - started
    finally:
        lab.ssh(gw, "sudo systemctl kill --signal=SIGCONT prometheus.service")
    # timed from the abort taken (the command's own event, on lab-gw's clock: the host's) to the gateway
    # serving the stable stage; the whole command's time (invoke's start on a loaded machine) is shown
    (taken,) = [e for e in _remote(lab, "history", "--last", "400") if e["event"] == "abort"][-1:]
    assert served_at - taken["at"] <= ROLLBACK_S, (
        f"the gateway served colocated {served_at - taken['at']:.1f} s after the abort was taken "
        f"({took:.1f} s after invoke rollout.abort started)"
    )
    status = _wait(lambda: (s := _status(lab))["phase"] == "aborted" and s, 10, "the abort")
    assert (status["stage"], status["stable_stage"], status["version"]) == ("colocated", "colocated", version)
    assert traffic["failed"] == [], traffic["failed"][:3]


def test_dry_run_measures_the_gates_and_changes_nothing(
    lab: LabHandle, at_colocated: None, traffic: dict[str, Any]
) -> None:
    before = _status(lab)
    out = _ok("rollout", "--stage", "long-prompts", "--dry-run")
    assert "nothing changed" in out and "ttft-p99-vs-colocated" in out
    after = _status(lab)
    assert (after["phase"], after["stage"], after["version"]) == (
        before["phase"],
        before["stage"],
        before["version"],
    )


def test_a_stopped_decode_service_rolls_back_within_5_s(
    lab: LabHandle,
    provisioned: dict[str, str],
    at_colocated: None,
    traffic: dict[str, Any],
    last_traffic: dict[str, float],
) -> None:
    """Timed at the gateway: from the first scrape that holds a fallback (the breach is measurable) to
    the gateway serving the stable stage, within the 5 s the profile promises; its decision counters
    then show no long prompt sent to the disaggregated pool. Last in the file: no rollout test after it
    waits its fallbacks out of the gates' window (the bench, next, reads only its own runs' windows)."""
    _ok("rollout", "--stage", "long-prompts", "--no-watch")
    step = _active(lab, lambda s: s["weights"]["long"] >= 25, 120, "the rollout past its first step")
    time.sleep(5)  # a failure counts once the window holds the step's minimum samples: the fault comes after
    before = _prometheus_fallbacks()
    stopping_at = time.monotonic()
    rc, _, err = lab.ssh(_host(lab, "lab-d1"), "sudo systemctl stop vllm-decode.service")
    assert rc == 0, err
    last_traffic["fault"] = 1.0  # the window now holds fallbacks: the next test waits them out
    try:
        _wait(lambda: _prometheus_fallbacks() > before, 60, "a fallback in Prometheus", every=0.1)
        measurable_at = time.monotonic()
        version, stage = _wait(
            lambda: (got := _served())[1] == step["stable_stage"] and got, 30, "the rollback", every=0.1
        )
        took = time.monotonic() - measurable_at
        assert took <= ROLLBACK_S, f"the gateway served {stage} {took:.1f} s after the breach was measurable"
        settled = _decisions()
        time.sleep(3)
        after = _decisions()
        moved = {k: after.get(k, 0.0) - settled.get(k, 0.0) for k in after}
        assert not [k for k, n in moved.items() if n and k[1] == "disagg"], moved
        assert moved.get((stage, "colocated"), 0) > 0, moved
        status = _status(lab)
        assert (status["phase"], status["stage"], status["version"]) == ("degraded", stage, version)
        # a dry-run gate (lab-cross's ITL ratio) may fail too: it is shown, never the reason
        failed = [r for r in status["last_results"] if r["outcome"] == "fail" and not r["dry_run"]]
        assert failed and failed[0]["gate"] in status["reason"] and failed[0]["value"] is not None
        degraded = _invoke("rollout.status")
        assert degraded.returncode == 0 and "degraded" in degraded.stdout
    finally:
        lab.ssh(_host(lab, "lab-d1"), "sudo systemctl start vllm-decode.service")
        _warm_disagg(provisioned)
    # fallbacks are counted, not failed: every request sent after the stop gets a whole stream. The one
    # stream already decoding on lab-d1 when its unit stopped may end with the server's shutdown error
    # (one long stream runs at a time; the gateway cannot retry a stream past its first byte)
    failures = list(zip(traffic["failed"], traffic["failed_started"], strict=True))
    assert [e for e, t in failures if t >= stopping_at] == [], failures[:3]
    assert len(failures) <= 1 and all("shutting down" in e for e, _ in failures), failures[:3]

"""The gateway as deployed by `invoke provision --profile lab-cross` (HTTPS with the lab CA): the real OpenAI
SDK through it with only OPENAI_BASE_URL/OPENAI_API_KEY/SSL_CERT_FILE from `invoke lab.env`, and refused
without the CA; the override header reaching each
pool (seen in that pool's own vLLM metrics); the router killed → fallback, counted; a stage change
reloads the gateway without restarting it; a stopped prefill service is bypassed (the decider); the
router runs with the profile's policy."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import openai
import pytest

from pdfleet.gateway.tls import client_context
from pdfleet.lab import pki
from pdfleet.lab.paths import LabPaths
from pdfleet.metrics.scrape import scrape_metrics
from tests.lab.helpers import REPO_ROOT, LabHandle, gateway_open, gateway_url, lab_deployment

INVOKE = [sys.executable, "-m", "invoke"]
PROFILE = "lab-cross"
MODEL = "llama-3.1-8b"
# the colocated pool has two instances (lab-colo1, lab-colo2); the gateway balances across them
COLOCATED_URLS = ("http://198.18.0.11:8000", "http://198.18.0.12:8000")
DECODE_URL = "http://198.18.0.31:8200"
GATEWAY_URL = gateway_url(PROFILE)  # https://198.18.0.10:8080: the topology's, lab-cross is on TLS
POOL_HEADER = "X-Pdfleet-Pool"


def _invoke(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*INVOKE, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, check=False
    )


def _sample_sum(base_url: str | tuple[str, ...], name: str) -> float:
    """A metric summed over its label sets, from a server's /metrics (or summed over a pool's servers); the
    gateway's verified against the topology's CA."""
    urls = (base_url,) if isinstance(base_url, str) else base_url
    tls = client_context(lab_deployment(PROFILE).topology.gateways[0].ca_file)
    return sum(scrape_metrics(url, tls if url == GATEWAY_URL else None).get(name, 0.0) for url in urls)


def _chat(client: openai.OpenAI, pool: str | None = None, **kwargs: object):  # noqa: ANN202
    headers = {POOL_HEADER: pool} if pool else None
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], extra_headers=headers, **kwargs
    )


def _gw(lab: LabHandle):  # noqa: ANN202 - LabHost
    return next(h for h in lab.hosts if h.name == "lab-gw")


@pytest.fixture(scope="module")
def client_env(lab: LabHandle, lab_cross_for_gateway: None) -> dict[str, str]:
    """lab-cross provisioned (once for this module and the Anthropic one); the environment
    `eval "$(invoke lab.env)"` gives a shell."""
    env_proc = _invoke("lab.env")
    assert env_proc.returncode == 0, env_proc.stderr
    env = {}
    for line in env_proc.stdout.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = value.strip("'\"")
    # both SDKs' variables and the lab CA: lab-cross's gateway speaks HTTPS
    assert set(env) == {
        "OPENAI_BASE_URL", "OPENAI_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", "SSL_CERT_FILE"
    }  # fmt: skip
    assert env["OPENAI_BASE_URL"] == GATEWAY_URL + "/v1" and GATEWAY_URL.startswith("https://")
    return env


@pytest.fixture
def client(client_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> openai.OpenAI:
    """The SDK configured only through the environment, as any OpenAI client would be."""
    for key, value in client_env.items():
        monkeypatch.setenv(key, value)
    return openai.OpenAI(max_retries=0, timeout=60)


def test_openai_sdk_streams_and_non_streams_through_the_gateway(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]
    chat = _chat(client, max_tokens=12)
    assert chat.usage.completion_tokens == 12 and chat.choices[0].message.content
    chunks = list(_chat(client, max_tokens=12, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].usage.completion_tokens == 12
    comp = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=7)
    assert comp.usage.completion_tokens == 7
    streamed = list(client.completions.create(model=MODEL, prompt="Once upon", max_tokens=7, stream=True))
    assert sum(1 for c in streamed if c.choices and c.choices[0].text) == 7


def test_a_client_that_does_not_trust_the_lab_ca_is_refused(
    client_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same environment without SSL_CERT_FILE: the system's trust, which lacks the lab CA; both SDKs
    fail on the certificate before any byte of the request (no plain-HTTP fallback)."""
    import anthropic

    for key, value in client_env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SSL_CERT_FILE")
    with pytest.raises(openai.APIConnectionError) as oai:
        openai.OpenAI(max_retries=0, timeout=20).models.list()
    with pytest.raises(anthropic.APIConnectionError) as claude:
        anthropic.Anthropic(max_retries=0, timeout=20).messages.create(
            model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "hi"}]
        )
    for exc in (oai.value, claude.value):
        assert "CERTIFICATE_VERIFY_FAILED" in repr(exc.__cause__) + repr(exc.__context__), exc


@pytest.mark.parametrize(("pool", "pool_url"), [("colocated", COLOCATED_URLS), ("disagg", DECODE_URL)])
def test_override_header_reaches_each_pool(
    client: openai.OpenAI, pool: str, pool_url: str | tuple[str, ...]
) -> None:
    before = _sample_sum(pool_url, "vllm:request_success_total")
    for _ in range(3):
        _chat(client, pool, max_tokens=4)
    assert _sample_sum(pool_url, "vllm:request_success_total") - before == 3


def _admin_policy() -> dict:
    request = urllib.request.Request(GATEWAY_URL + "/admin/policy")
    admin_key = LabPaths().gateway_admin_key.read_text().strip()
    request.add_header("Authorization", f"Bearer {admin_key}")
    return json.loads(gateway_open(request))


def _decision(client: openai.OpenAI) -> str:
    """One short chat without the pool header; the gateway's reason for where it went."""
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=2
    )
    assert raw.parse().usage.completion_tokens == 2  # answered: no request fails meanwhile
    return raw.headers["X-Pdfleet-Decision"]


def _prefill_stopped_is_bypassed_within_2_s(lab: LabHandle, client: openai.OpenAI) -> None:
    """The P/D share staged: a stopped prefill service is unknown to the decider's poll, never idle, and
    its share stays colocated as `prefill_busy` within 2 s (lab-cross's decider.prefill_busy_waiting),
    every request answered meanwhile; started again, the share goes back to the P/D pool."""
    p1 = next(h for h in lab.hosts if h.name == "lab-p1")
    assert _decision(client) == "stage_weight"
    rc, _, err = lab.ssh(p1, "sudo -n systemctl stop vllm-prefill.service")
    assert rc == 0, err
    stopped = time.monotonic()
    seen: list[tuple[float, str]] = []
    try:
        while not seen or seen[-1][1] != "prefill_busy":
            assert time.monotonic() - stopped < 10, seen
            seen.append((round(time.monotonic() - stopped, 2), _decision(client)))
    finally:
        rc, _, err = lab.ssh(p1, "sudo -n systemctl start vllm-prefill.service")
    assert rc == 0, err
    assert seen[-1][0] <= 2.0, seen
    assert {d for _, d in seen} <= {"stage_weight", "fallback", "prefill_busy"}, seen
    deadline = time.monotonic() + 60
    while (back := _decision(client)) != "stage_weight" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert back == "stage_weight"


def test_stage_change_reloads_without_restart_and_a_dead_router_falls_back(
    lab: LabHandle, client: openai.OpenAI, tmp_path: Path
) -> None:
    gw = _gw(lab)
    _, pid_before, _ = lab.ssh(gw, "systemctl show -p MainPID --value pdfleet-gateway.service")
    version_before = _admin_policy()["version"]
    try:
        # the profile's gateway.stage is only the initial stage; --stage is the explicit override
        proc = _invoke("provision", "--profile", PROFILE, "--limit", "lab-gw", "--stage", "all-disagg")
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        _, pid_after, _ = lab.ssh(gw, "systemctl show -p MainPID --value pdfleet-gateway.service")
        assert pid_after == pid_before, "a policy change reloads the gateway, it does not restart it"
        policy = _admin_policy()
        assert policy["stage"] == "all-disagg" and policy["version"] > version_before, policy

        decode = _sample_sum(DECODE_URL, "vllm:request_success_total")
        _chat(client, max_tokens=4)
        assert _sample_sum(DECODE_URL, "vllm:request_success_total") - decode == 1, "staged to disagg"
        _prefill_stopped_is_bypassed_within_2_s(lab, client)

        rc, _, err = lab.ssh(gw, "sudo -n systemctl stop vllm-router-pd.service")
        assert rc == 0, err
        fallbacks = _sample_sum(GATEWAY_URL, "pdfleet_gateway_fallbacks_total")
        colocated = _sample_sum(COLOCATED_URLS, "vllm:request_success_total")
        reply = _chat(client, max_tokens=4)
        assert reply.usage.completion_tokens == 4
        assert _sample_sum(GATEWAY_URL, "pdfleet_gateway_fallbacks_total") - fallbacks == 1
        assert _sample_sum(COLOCATED_URLS, "vllm:request_success_total") - colocated == 1
    finally:
        report = tmp_path / "restore.json"
        restore = _invoke(
            "provision",
            "--profile",
            PROFILE,
            "--limit",
            "lab-gw",
            "--stage",
            "colocated",
            "--json",
            str(report),
        )
    assert restore.returncode == 0, restore.stderr[-2000:]
    changes = json.loads(report.read_text())["hosts"]["lab-gw"]["changes"]
    assert any("vllm-router-pd.service" in c["op"] for c in changes), "provision started the router again"
    assert _admin_policy()["stage"] == "colocated"


def test_router_runs_with_the_profiles_policy(client: openai.OpenAI, lab: LabHandle) -> None:
    """systemd starts vllm-router with round_robin (lab-cross's gateway.router_policy, the default),
    not the router's own cache_aware, and the router serves the P/D pool with it."""
    rc, out, err = lab.ssh(_gw(lab), "systemctl show -p ExecStart --value vllm-router-pd.service")
    assert rc == 0, err
    argv = out.split()  # "{ path=... ; argv[]=/opt/pdfleet/gateway/bin/vllm-router ... ; ... }"
    assert "--policy" in argv and argv[argv.index("--policy") + 1] == "round_robin", out
    decode = _sample_sum(DECODE_URL, "vllm:request_success_total")
    assert _chat(client, pool="disagg", max_tokens=3).usage.completion_tokens == 3
    assert _sample_sum(DECODE_URL, "vllm:request_success_total") - decode == 1


def _serial() -> int:
    """The serial number of the certificate a new connection to the gateway is presented (verified)."""
    address = urlsplit(GATEWAY_URL)
    host, port = address.hostname or "", address.port or 443
    ctx = client_context(lab_deployment(PROFILE).topology.gateways[0].ca_file)
    assert ctx is not None
    with (
        socket.create_connection((host, port), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname=host) as c,
    ):
        return int(c.getpeercert()["serialNumber"], 16)  # type: ignore[index]  # a verified peer's dict


def test_a_renewed_certificate_is_presented_after_a_reload_with_streams_in_flight_finishing(
    lab: LabHandle, client: openai.OpenAI
) -> None:
    """The site renews the gateway's certificate (the lab CA issues a new key and serial for the same
    names) and `invoke provision --roles gateway` pushes it: a reload, not a restart; two clients streaming
    back to back through it all the while see no failure, and a new connection gets the new certificate."""
    gw, before = _gw(lab), _serial()
    _, pid_before, _ = lab.ssh(gw, "systemctl show -p MainPID --value pdfleet-gateway.service")
    done, failures, stop = [0], [], threading.Event()

    def streams() -> None:  # one stream after another until stopped
        while not stop.is_set():
            try:
                text = "".join(
                    c.choices[0].delta.content or ""
                    for c in _chat(client, max_tokens=48, stream=True)
                    if c.choices
                )
                if not text:
                    failures.append("an empty stream")
                done[0] += 1
            except Exception as exc:  # any failure in flight is the finding
                failures.append(repr(exc))

    workers = [threading.Thread(target=streams) for _ in range(2)]
    for w in workers:
        w.start()
    try:
        time.sleep(1)  # both streaming
        paths = LabPaths()
        ca = pki.Pair(paths.tls_dir / "ca.crt", paths.tls_dir / "ca.key")
        address = lab_deployment(PROFILE).inventory.hosts[gw.name].address
        pki.issue(ca, paths.tls_dir, "gateway", [gw.name], [address])
        started = done[0]
        proc = _invoke("provision", "--profile", PROFILE, "--roles", "gateway", "--limit", gw.name)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        time.sleep(1)
        assert done[0] > started, "streams ran across the reload"
    finally:
        stop.set()
        for w in workers:
            w.join(90)
    assert not failures, failures[:3]
    _, pid_after, _ = lab.ssh(gw, "systemctl show -p MainPID --value pdfleet-gateway.service")
    assert pid_after == pid_before, "a renewed certificate reloads the gateway, it does not restart it"
    assert _serial() != before

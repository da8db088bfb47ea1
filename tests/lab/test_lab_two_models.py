"""Issue 24 in the lab: `invoke provision --profile lab-two-models` (plus an outside alias) serves the P/D
model and a small colocated one, and a "hosted provider" (a simulator on lab-d1 with its own key), through
one base URL and one key by changing only `model`; a second provision changes 0; a rollout of the P/D model
to long-prompts through the controller (`invoke rollout --model`) leaves the other model's group and
routing as they were, and so does staging it to long-prompts by hand through the admin API. lab-cross is
owed back at the end (it retires the two-model units), so the files after this one find the lab as they
expect."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from pdfleet.lab.hosts import LabHost, ssh_client
from pdfleet.lab.paths import LabPaths
from pdfleet.metrics.scrape import scrape_metrics
from tests.lab.helpers import (
    REPO_ROOT,
    LabCrossOwed,
    LabHandle,
    gateway_open,
    gateway_url,
    lab_deployment,
    lab_env,
    sdk_verify,
)

INVOKE = [sys.executable, "-m", "invoke"]
PD_MODEL, PD_ALIAS = "llama-8b", "llama-3.1-8b"
SMALL_MODEL, SMALL_ALIAS = "llama-1b", "llama-3.2-1b"
OUTSIDE_ALIAS, OUTSIDE_UPSTREAM = "hosted-chat", "hosted-upstream"
OUTSIDE_HOST, OUTSIDE_PORT = "lab-d1", 8300  # beside lab-d1's decode instance (8200)
OUTSIDE_UNIT = "pdfleet-test-outside.service"  # transient: gone once stopped
SMALL_URL = "http://198.18.0.12:8001"  # lab-colo2's second GPU
GATEWAY_URL = gateway_url("lab-two-models")  # the topology's: https, lab-two-models extends lab-cross (TLS)
SIM = "/opt/pdfleet/venv/bin/pdfleet-sim"
DECISIONS = "pdfleet_gateway_routing_decisions_total"


@dataclass(frozen=True)
class TwoModels:
    """The provisioned fleet as a client sees it, and the outside endpoint's own URL."""

    client: openai.OpenAI
    outside_url: str
    profile: Path


def _invoke(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*INVOKE, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, check=False
    )


def _provision(profile: str, report: Path, *extra: str) -> dict[str, Any]:
    proc = _invoke("provision", "--profile", profile, "--json", str(report), *extra)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data: dict[str, Any] = json.loads(report.read_text())
    return data


def _host(lab: LabHandle, name: str) -> LabHost:
    return next(h for h in lab.hosts if h.name == name)


def _start_outside(lab: LabHandle, key: str) -> str:
    """A simulator on lab-d1 (from the venv provision put there) standing in for a hosted provider: a
    transient unit whose key (VLLM_API_KEY) comes from a 0600 env file written over SFTP, never on a
    command line. Returns its base URL."""
    host = _host(lab, OUTSIDE_HOST)
    client = ssh_client(host.address, lab.paths.key_file, lab.paths.known_hosts, 20)
    try:
        sftp = client.open_sftp()
        env_file = f"{sftp.normalize('.')}/outside.env"
        with sftp.file(env_file, "w") as fh:
            fh.chmod(0o600)
            fh.write(f"VLLM_API_KEY={key}\n")
        sftp.close()
    finally:
        client.close()
    stop = f"sudo -n systemctl stop {OUTSIDE_UNIT}; sudo -n systemctl reset-failed {OUTSIDE_UNIT}"
    lab.ssh(host, f"{{ {stop}; }} 2>/dev/null; true")
    # a model of the simulator's catalog, served under the provider's own name
    argv = (
        f"{SIM} serve meta-llama/Llama-3.2-1B-Instruct --served-model-name {OUTSIDE_UPSTREAM} "
        f"--host {host.address} --port {OUTSIDE_PORT}"
    )
    rc, _, err = lab.ssh(
        host,
        f"sudo -n systemd-run --collect --unit {OUTSIDE_UNIT} --property=EnvironmentFile={env_file} {argv}",
    )
    assert rc == 0, err
    url = f"http://{host.address}:{OUTSIDE_PORT}"
    wait = f"for i in $(seq 60); do curl -sf {url}/health >/dev/null && exit 0; sleep 0.5; done; exit 1"
    rc, _, err = lab.ssh(host, wait)
    assert rc == 0, f"the outside simulator did not answer on {url}: {err}"
    return url


@pytest.fixture(scope="module")
def fleet(
    lab: LabHandle, lab_cross_owed: LabCrossOwed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TwoModels]:
    """lab-two-models with an outside alias, provisioned twice (the second changing 0); lab-cross owed back
    (tests/lab/conftest.py: SWITCHING) from the first provision on."""
    tmp = tmp_path_factory.mktemp("two")
    key_file = tmp / "outside.key"
    key_file.touch(mode=0o600)
    key_file.write_text(secrets.token_urlsafe(24) + "\n")
    outside_url = f"http://{_host(lab, OUTSIDE_HOST).address}:{OUTSIDE_PORT}"
    # the same name as the shipped profile, which it extends (a file never extends itself)
    profile = tmp / "lab-two-models.yml"
    profile.write_text(
        "extends: lab-two-models\n"
        "gateway:\n"
        "  outside:\n"
        f"    {OUTSIDE_ALIAS}:\n"
        f"      {{api: openai, base_url: '{outside_url}', upstream_model: {OUTSIDE_UPSTREAM}, "
        f"key_file: '{key_file}'}}\n"
    )
    lab_cross_owed.owed = True
    try:
        _provision(str(profile), tmp / "first.json")
        second = _provision(str(profile), tmp / "second.json")
        assert second["totals"]["changed"] == 0, {h: v["changes"] for h, v in second["hosts"].items()}
        assert _start_outside(lab, key_file.read_text().strip()) == outside_url
        env = lab_env("lab-two-models")
        client = openai.OpenAI(
            base_url=env["OPENAI_BASE_URL"],
            api_key=env["OPENAI_API_KEY"],
            max_retries=0,
            timeout=60,
            http_client=openai.DefaultHttpxClient(verify=sdk_verify(env)),
        )
        yield TwoModels(client, outside_url, profile)
    finally:
        lab.ssh(_host(lab, OUTSIDE_HOST), f"sudo -n systemctl stop {OUTSIDE_UNIT}; rm -f outside.env")


def _admin(path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{GATEWAY_URL}{path}", data=data, method="POST" if data else "GET")
    request.add_header("Authorization", f"Bearer {LabPaths().gateway_admin_key.read_text().strip()}")
    request.add_header("Content-Type", "application/json")
    answer: dict[str, Any] = json.loads(gateway_open(request, "lab-two-models"))
    return answer


def _success(url: str) -> float:
    return scrape_metrics(url).get("vllm:request_success_total", 0.0)


def _decisions(model: str, pool: str) -> float:
    """The gateway's routing decisions for one model (its group: the label) that chose `pool`, summed over
    the other labels."""
    text = gateway_open(f"{GATEWAY_URL}/metrics", "lab-two-models").decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(DECISIONS + "{") and f'model="{model}"' in line and f'pool="{pool}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def _chat(client: openai.OpenAI, model: str, content: str = "hello", max_tokens: int = 6) -> str:
    chunks = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": content}],
        max_tokens=max_tokens,
        stream=True,
    )
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_one_base_url_and_key_reach_both_models_and_the_outside_alias(fleet: TwoModels) -> None:
    listed = {m.id for m in fleet.client.models.list()}
    assert {PD_ALIAS, SMALL_ALIAS, OUTSIDE_ALIAS} <= listed, listed
    reply = fleet.client.chat.completions.create(
        model=PD_ALIAS, messages=[{"role": "user", "content": "hi"}], max_tokens=5
    )
    assert reply.usage is not None and reply.usage.completion_tokens == 5
    small = _success(SMALL_URL)
    assert _chat(fleet.client, SMALL_ALIAS)  # only `model` changed: same client, URL and key
    assert _success(SMALL_URL) - small == 1, "llama-3.2-1b is served by its own instance on lab-colo2:8001"
    outside = _success(fleet.outside_url)
    assert _chat(fleet.client, OUTSIDE_ALIAS)
    assert _success(fleet.outside_url) - outside == 1, "the outside alias streamed from the 'provider'"
    # the provider's key is the gateway's, not the client's: the client's key is refused there directly
    direct = openai.OpenAI(base_url=f"{fleet.outside_url}/v1", api_key=fleet.client.api_key, max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        direct.chat.completions.create(
            model=OUTSIDE_UPSTREAM, messages=[{"role": "user", "content": "x"}], max_tokens=1
        )


def _stage_pd_model_by_hand(stage: str) -> dict[str, Any]:
    """The P/D model's group set to a stage through the gateway's admin API (as a rollout step sets it);
    the gateway's answer."""
    version = _admin("/admin/policy")["version"]
    stages = lab_deployment("lab-two-models").profile.served_model(PD_MODEL).gateway.stages
    body = {"version": version + 1, "stage": stage, "stages": {k: v.model_dump() for k, v in stages.items()}}
    return _admin("/admin/stage", {**body, "model": PD_MODEL})


def test_a_rollout_of_the_pd_model_to_long_prompts_leaves_the_small_model_s_stage_alone(
    fleet: TwoModels,
) -> None:
    """`invoke rollout --model llama-8b --stage long-prompts` from colocated: the controller's first step
    reaches the P/D model's group on the gateway, the small model's group keeps every setting and sends
    long prompts to its colocated pool, the top-level stage is as it was; rollout.status shows both
    models; abort puts the P/D model back. Without --model the rollout is refused naming both models."""
    profile = str(fleet.profile)
    refused = _invoke("rollout", "--profile", profile, "--stage", "long-prompts", "--no-watch")
    assert refused.returncode != 0 and f"{PD_MODEL}, {SMALL_MODEL}" in refused.stderr, refused.stderr
    before = _admin("/admin/policy")
    stable = before["groups"][PD_MODEL]["stage"]
    # the controller has read what the gateway runs (colocated, as provisioned)
    _until(lambda: f"stage {stable} (" in _status_of(fleet.profile, PD_MODEL), 30, "the controller's view")
    submit = ("--profile", profile, "--model", PD_MODEL, "--stage", "long-prompts", "--no-watch")
    proc = _invoke("rollout", *submit)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    groups = _until(
        lambda: (g := _admin("/admin/policy"))["groups"][PD_MODEL]["stage"] == "long-prompts@0" and g,
        30,
        "the first step on the gateway",
    )
    assert groups["stage"] == before["stage"], "the top-level stage moved"
    assert groups["groups"][PD_MODEL]["stage_percent_disagg"] == {"short": 0, "long": 10}
    kept = {k: v for k, v in before["groups"][SMALL_MODEL].items() if k != "decisions"}
    assert {k: v for k, v in groups["groups"][SMALL_MODEL].items() if k != "decisions"} == kept
    assert "rollout to long-prompts" in _status_of(fleet.profile, PD_MODEL)
    small_colocated = _decisions(SMALL_MODEL, "colocated")
    for _ in range(2):
        assert _chat(fleet.client, SMALL_ALIAS, "tell me a long story " * 2000, 2)
    assert _decisions(SMALL_MODEL, "colocated") - small_colocated == 2
    assert _decisions(SMALL_MODEL, "disagg") == 0
    proc = _invoke("rollout.abort", "--profile", profile, "--model", PD_MODEL)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    after = _until(
        lambda: (g := _admin("/admin/policy"))["groups"][PD_MODEL]["stage"] == stable and g,
        30,
        "the P/D model back on its stable stage",
    )
    assert {k: v for k, v in after["groups"][SMALL_MODEL].items() if k != "decisions"} == kept


def test_staging_the_pd_model_to_long_prompts_leaves_the_small_model_alone(fleet: TwoModels) -> None:
    before = _admin("/admin/policy")
    groups = before["groups"]
    small_stage = groups[SMALL_MODEL]["stage"]
    answer = _stage_pd_model_by_hand("long-prompts")
    assert answer["stage"] == "long-prompts" and answer["model"] == PD_MODEL, answer
    after = _admin("/admin/policy")["groups"]
    assert after[PD_MODEL]["stage"] == "long-prompts"
    # every setting of the small model's group is as it was; its decision counts restart with the new
    # policy version (/admin/policy counts since the active policy was loaded)
    kept = {k: v for k, v in groups[SMALL_MODEL].items() if k != "decisions"}
    assert {k: v for k, v in after[SMALL_MODEL].items() if k != "decisions"} == kept
    assert after[SMALL_MODEL]["stage"] == small_stage
    long_prompt = "tell me a long story " * 2000  # ~10k tokens: over both thresholds (8192, 4096)
    pd_disagg = _decisions(PD_MODEL, "disagg")
    small_disagg, small_colocated = _decisions(SMALL_MODEL, "disagg"), _decisions(SMALL_MODEL, "colocated")
    assert _chat(fleet.client, PD_ALIAS, long_prompt, 2)
    for _ in range(3):
        assert _chat(fleet.client, SMALL_ALIAS, long_prompt, 2)
    assert _decisions(PD_MODEL, "disagg") - pd_disagg == 1, "the P/D model's long prompt went to P/D"
    assert _decisions(SMALL_MODEL, "disagg") == small_disagg == 0
    assert _decisions(SMALL_MODEL, "colocated") - small_colocated == 3


def _status_of(profile: Path, model: str) -> str:
    """`invoke rollout.status`'s section for one model (every model's is shown, a blank line between)."""
    proc = _invoke("rollout.status", "--profile", str(profile))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    sections = proc.stdout.split("\n\n")
    assert any(s.startswith(f"model {SMALL_MODEL}:") for s in sections), proc.stdout
    return next(s for s in sections if s.startswith(f"model {model}:"))


def _until(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"{what} did not happen within {timeout:g} s")

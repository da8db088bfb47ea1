"""The gateway as `invoke provision --profile lab-cross` deploys it (HTTPS, the lab CA), from Anthropic
clients: the Anthropic SDK streams and non-streams through it trusting the CA `invoke lab.env` exports,
with the lab's key (as x-api-key and as a Bearer token), a wrong key is the SDK's AuthenticationError; and
per-key limits set in a profile reach the gateway by a reload, refuse with 429 + Retry-After (OpenAI and
Anthropic shapes) and 400 over the prompt cap, counted."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import anthropic
import openai
import pytest

from pdfleet.lab.paths import LabPaths
from pdfleet.metrics.scrape import scrape_metrics
from tests.lab.helpers import REPO_ROOT, LabHandle, gateway_open, gateway_url, lab_env, sdk_verify

INVOKE = [sys.executable, "-m", "invoke"]
PROFILE = "lab-cross"
MODEL = "llama-3.1-8b"
GATEWAY_URL = gateway_url(PROFILE)  # the topology's: https, lab-cross is on TLS
# the colocated pool: lab-colo1 and lab-colo2, balanced by the gateway
COLOCATED_URLS = ("http://198.18.0.11:8000", "http://198.18.0.12:8000")


def _invoke(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*INVOKE, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, check=False
    )


@pytest.fixture(scope="module")
def lab_key(lab: LabHandle, lab_cross_for_gateway: None) -> str:
    """lab-cross provisioned (once for this module and the OpenAI one before it); the client key
    `invoke lab.env` hands a shell (OPENAI_API_KEY)."""
    return lab_env()["OPENAI_API_KEY"]


def _anthropic(monkeypatch: pytest.MonkeyPatch, **env: str) -> anthropic.Anthropic:
    """The SDK configured only through the environment, as Claude-style clients are."""
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", GATEWAY_URL)
    monkeypatch.setenv("SSL_CERT_FILE", lab_env()["SSL_CERT_FILE"])  # the lab CA, as lab.env exports it
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return anthropic.Anthropic(max_retries=0, timeout=60)


def _gateway_metric(name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = gateway_open(GATEWAY_URL + "/metrics").decode()
    return sum(
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


@pytest.mark.parametrize("variable", ["ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"])
def test_anthropic_sdk_streams_and_non_streams_with_the_labs_key(
    lab_key: str, monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    client = _anthropic(monkeypatch, **{variable: lab_key})
    colocated = _colocated_successes()
    msg = client.messages.create(
        model=MODEL, max_tokens=8, system="be brief", messages=[{"role": "user", "content": "hello"}]
    )
    assert msg.usage.output_tokens == 8 and msg.usage.input_tokens > 0 and msg.stop_reason == "max_tokens"
    assert msg.content[0].type == "text" and msg.content[0].text
    with client.messages.stream(
        model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "hello"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.usage.output_tokens == 8
    # the lab's stage keeps short prompts colocated, and the Messages route always stays there
    assert _colocated_successes() - colocated == 2


def test_a_wrong_anthropic_key_is_the_sdks_authentication_error(
    lab_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = _anthropic(monkeypatch, ANTHROPIC_API_KEY=lab_key + "x")
    with pytest.raises(anthropic.AuthenticationError) as exc:
        client.messages.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    assert exc.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    assert lab_key not in str(exc.value)


def _limited_profile(tmp_path: Path) -> Path:
    """lab-cross with per-key limits on the client key, as an operator would write them."""
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    for src in (REPO_ROOT / "profiles").glob("*.yml"):
        (profiles / src.name).write_text(src.read_text())
    limited = profiles / "lab-cross-limited.yml"
    limited.write_text(
        f"extends: {PROFILE}\n"
        "gateway:\n"
        "  policy_version: 3\n"
        "  limits:\n"
        "    keys: {client: {requests_per_second: 0.1, burst: 2}}\n"
        "    model_max_prompt_tokens: 2000\n"
    )
    return limited


def _admin_policy() -> dict:
    request = urllib.request.Request(GATEWAY_URL + "/admin/policy")
    request.add_header("Authorization", f"Bearer {LabPaths().gateway_admin_key.read_text().strip()}")
    return json.loads(gateway_open(request))


def test_profile_limits_reload_and_refuse_in_each_routes_shape(
    lab: LabHandle, lab_key: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    gw = next(h for h in lab.hosts if h.name == "lab-gw")
    _, pid_before, _ = lab.ssh(gw, "systemctl show -p MainPID --value pdfleet-gateway.service")
    http = openai.DefaultHttpxClient(verify=sdk_verify(lab_env()))
    oai = openai.OpenAI(
        base_url=GATEWAY_URL + "/v1", api_key=lab_key, max_retries=0, timeout=60, http_client=http
    )
    claude = _anthropic(monkeypatch, ANTHROPIC_API_KEY=lab_key)
    hello = [{"role": "user", "content": "hello"}]
    version_before = _admin_policy()["version"]
    try:
        proc = _invoke("provision", "--profile", str(_limited_profile(tmp_path)), "--limit", "lab-gw")
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        _, pid_after, _ = lab.ssh(gw, "systemctl show -p MainPID --value pdfleet-gateway.service")
        assert pid_after == pid_before, "new limits reload the gateway, they do not restart it"
        # earlier tests may have moved the live version past the profile's: new limits go one above it
        assert _admin_policy()["version"] == max(version_before + 1, 3)
        rate_before = _gateway_metric("pdfleet_gateway_limit_rejections_total", key="client", reason="rate")

        for _ in range(2):  # the burst
            assert oai.chat.completions.create(model=MODEL, messages=hello, max_tokens=2).choices
        with pytest.raises(openai.RateLimitError) as over:
            oai.chat.completions.create(model=MODEL, messages=hello, max_tokens=2)
        assert int(over.value.response.headers["Retry-After"]) >= 1
        assert "requests per second" in over.value.message
        with pytest.raises(anthropic.RateLimitError) as over_a:
            claude.messages.create(model=MODEL, max_tokens=2, messages=hello)  # type: ignore[arg-type]
        assert over_a.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
        assert int(over_a.value.response.headers["Retry-After"]) >= 1
        assert (
            _gateway_metric("pdfleet_gateway_limit_rejections_total", key="client", reason="rate")
            - rate_before
            == 2
        )

        # the admin key has no rate limit, only the alias's prompt cap
        admin = _anthropic(monkeypatch, ANTHROPIC_API_KEY=LabPaths().gateway_admin_key.read_text().strip())
        long_prompt = [{"role": "user", "content": "word " * 2000}]  # ~2500 tokens by the lab's estimate
        with pytest.raises(anthropic.BadRequestError) as too_long:
            admin.messages.create(model=MODEL, max_tokens=2, messages=long_prompt)  # type: ignore[arg-type]
        assert f"limit for this model '{MODEL}' is 2000 prompt tokens" in str(too_long.value)
        prompt_rejections = _gateway_metric(
            "pdfleet_gateway_limit_rejections_total", key="admin", reason="prompt_tokens"
        )
        assert prompt_rejections >= 1
    finally:
        restore = _invoke("provision", "--profile", PROFILE, "--limit", "lab-gw")
    assert restore.returncode == 0, restore.stderr[-2000:]
    assert _admin_policy()["limits"]["spec"] == {}


def _colocated_successes() -> float:
    """Requests the colocated pool's instances finished, summed over the pool."""
    return sum(scrape_metrics(url).get("vllm:request_success_total", 0.0) for url in COLOCATED_URLS)

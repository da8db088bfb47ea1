"""The client view end to end: the real OpenAI and Anthropic SDKs against the real gateway and simulator on
loopback, one fault made per test, and the rule that must name it (no HTTP mock anywhere)."""

from __future__ import annotations

import json

import pytest

from pdfleet.bench.procs import free_port
from pdfleet.doctor.client import check_client
from pdfleet.doctor.finding import Finding, has_error
from pdfleet.doctor.probe import ScriptCall
from pdfleet.doctor.report import to_json
from tests.unit.doctor.helpers import VLLM_LOCAL_KEY, ClientFleet
from tests.unit.gateway.helpers import USER_KEY

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py

CHAT_BODY = {"model": "llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def rules(findings: list[Finding]) -> set[str]:
    return {f.rule for f in findings if f.severity != "ok"}


def openai_check(base: str, key: str = USER_KEY, **kw: object) -> list[Finding]:
    _facts, findings = check_client(base, key, "OPENAI_API_KEY", False, {}, **kw)  # type: ignore[arg-type]
    text = to_json(findings, "client", base)
    assert key.strip() not in text  # the key never reaches the output, whatever the finding
    return findings


def anthropic_env(fleet: ClientFleet, key: str = USER_KEY) -> dict[str, str]:
    return {"ANTHROPIC_BASE_URL": fleet.anthropic_base, "ANTHROPIC_API_KEY": key}


def test_a_healthy_gateway_gives_no_problem(client_fleet: ClientFleet) -> None:
    findings = openai_check(client_fleet.openai_base)
    assert [f.rule for f in findings] == ["client.ok"]
    assert "choices[0].message.content" in findings[0].evidence


@pytest.mark.parametrize("key", [USER_KEY + " ", " " + USER_KEY, USER_KEY + "\n"])
def test_whitespace_around_the_key(client_fleet: ClientFleet, key: str) -> None:
    findings = openai_check(client_fleet.openai_base, key)
    found = [f for f in findings if f.rule == "client.key_whitespace"]
    assert found and found[0].severity == "error" and has_error(findings)
    assert "sk-…cdef" in found[0].evidence and "tr -d" in found[0].fix


def test_header_text_in_the_key_variable(client_fleet: ClientFleet) -> None:
    findings = openai_check(client_fleet.openai_base, "Bearer " + USER_KEY)
    assert "client.auth_header" in rules(findings)
    assert "client.invalid_key" not in rules(findings)


def test_a_key_the_gateway_does_not_know(client_fleet: ClientFleet) -> None:
    findings = openai_check(client_fleet.openai_base, "sk-not-a-gateway-key-42")
    found = [f for f in findings if f.rule == "client.invalid_key"]
    assert found and "not valid for this gateway" in found[0].what
    assert "→ 401" in found[0].evidence and "gateway-client.key" in found[0].fix


@pytest.mark.parametrize(
    ("suffix", "why"),
    [
        ("", "does not end with /v1"),
        ("/v1?api-version=1", "query string"),
        ("/v1/chat/completions", "ends with the endpoint"),
    ],
)
def test_a_base_url_with_the_wrong_path(client_fleet: ClientFleet, suffix: str, why: str) -> None:
    base = f"http://127.0.0.1:{client_fleet.gateway_port}{suffix}"
    findings = openai_check(base)
    found = [f for f in findings if f.rule == "client.base_url"]
    assert found and why in found[0].what
    assert found[0].fix.endswith(f"http://127.0.0.1:{client_fleet.gateway_port}/v1")


def test_a_base_url_at_a_pool_port(client_fleet: ClientFleet) -> None:
    findings = openai_check(client_fleet.pool_url + "/v1")
    found = [f for f in findings if f.rule == "client.pool_port"]
    assert found and "not at the gateway" in found[0].what
    assert "empty 200" in found[0].evidence and "owned_by 'vllm'" in found[0].evidence
    assert "point at the gateway" in found[0].fix


def test_a_pool_port_with_vllms_own_key_check(client_fleet: ClientFleet) -> None:
    findings = openai_check(client_fleet.guarded_url + "/v1")
    assert rules(findings) == {"client.pool_port"}
    assert "vLLM's own --api-key" in findings[0].what
    # the same instance with its local key: still the wrong place for a client
    findings = openai_check(client_fleet.guarded_url + "/v1", VLLM_LOCAL_KEY)
    assert rules(findings) == {"client.pool_port"}


def test_connection_refused() -> None:
    findings = openai_check(f"http://127.0.0.1:{free_port()}/v1")
    assert rules(findings) == {"client.unreachable"}
    assert "connection refused" in findings[0].what and "no answer" in findings[0].evidence


def test_a_chat_body_sent_to_completions(client_fleet: ClientFleet) -> None:
    script = ScriptCall("completions", CHAT_BODY, False)
    findings = openai_check(client_fleet.openai_base, script=script)
    found = [f for f in findings if f.rule == "client.wrong_endpoint"]
    assert found and "KeyError 'choices'" in found[0].what
    assert "missing required field 'prompt'" in found[0].evidence and "chat/completions" in found[0].fix


def test_a_prompt_body_sent_to_chat_completions(client_fleet: ClientFleet) -> None:
    script = ScriptCall("chat/completions", {"model": "llama", "prompt": "hi", "max_tokens": 2}, False)
    assert "client.wrong_endpoint" in rules(openai_check(client_fleet.openai_base, script=script))


def test_the_right_endpoint_for_the_body_is_fine(client_fleet: ClientFleet) -> None:
    script = ScriptCall("chat/completions", CHAT_BODY, False)
    findings = openai_check(client_fleet.openai_base, script=script)
    assert not rules(findings)


def test_the_script_reads_a_stream_it_did_not_ask_for(client_fleet: ClientFleet) -> None:
    script = ScriptCall("chat/completions", CHAT_BODY, True)
    found = [
        f for f in openai_check(client_fleet.openai_base, script=script) if f.rule == "client.stream_mismatch"
    ]
    assert found and 'add "stream": true' in found[0].fix


def test_the_script_asks_for_a_stream_and_reads_json(client_fleet: ClientFleet) -> None:
    script = ScriptCall("chat/completions", {**CHAT_BODY, "stream": True}, False)
    found = [
        f for f in openai_check(client_fleet.openai_base, script=script) if f.rule == "client.stream_mismatch"
    ]
    assert found and "text/event-stream" in found[0].evidence


def test_an_alias_with_no_route(client_fleet: ClientFleet) -> None:
    findings = openai_check(client_fleet.openai_base, model="gpt-4o")
    found = [f for f in findings if f.rule == "client.model_route"]
    assert found and "'gpt-4o'" in found[0].what and "(llama)" in found[0].fix
    assert "model_not_found" in found[0].evidence


def test_anthropic_healthy(client_fleet: ClientFleet) -> None:
    _facts, findings = check_client(
        client_fleet.anthropic_base, USER_KEY, "ANTHROPIC_API_KEY", True, anthropic_env(client_fleet)
    )
    assert [f.rule for f in findings] == ["client.ok"]
    assert findings[0].evidence.count("/v1/messages → 200") == 3  # SDK, SDK streaming, x-api-key


def test_anthropic_wrong_key(client_fleet: ClientFleet) -> None:
    env = anthropic_env(client_fleet, "sk-ant-wrong-000000000")
    _facts, findings = check_client(
        client_fleet.anthropic_base, env["ANTHROPIC_API_KEY"], "ANTHROPIC_API_KEY", True, env, model="llama"
    )
    found = [f for f in findings if f.rule == "anthropic.authentication_error"]
    assert found and "authentication_error" in found[0].what
    assert "sk-ant-wrong" not in json.dumps([f.to_json() for f in findings])


def test_anthropic_variables_unset(client_fleet: ClientFleet) -> None:
    _facts, findings = check_client(client_fleet.anthropic_base, None, "ANTHROPIC_API_KEY", True, {})
    assert {"anthropic.base_url_unset", "anthropic.key_unset"} <= rules(findings)


def test_anthropic_base_url_with_v1(client_fleet: ClientFleet) -> None:
    env = {**anthropic_env(client_fleet), "ANTHROPIC_BASE_URL": client_fleet.anthropic_base + "/v1"}
    _facts, findings = check_client(env["ANTHROPIC_BASE_URL"], USER_KEY, "ANTHROPIC_API_KEY", True, env)
    found = [f for f in findings if f.rule == "client.base_url"]
    assert found and "appends /v1/messages" in found[0].what


def test_anthropic_base_url_elsewhere(client_fleet: ClientFleet) -> None:
    env = {**anthropic_env(client_fleet), "ANTHROPIC_BASE_URL": "http://127.0.0.1:1"}
    _facts, findings = check_client(client_fleet.anthropic_base, USER_KEY, "ANTHROPIC_API_KEY", True, env)
    assert rules(findings) == {"anthropic.base_url_wrong"}


def test_anthropic_alias_without_access(client_fleet: ClientFleet) -> None:
    _facts, findings = check_client(
        client_fleet.anthropic_base,
        USER_KEY,
        "ANTHROPIC_API_KEY",
        True,
        anthropic_env(client_fleet),
        model="claude-sonnet-4-5",
    )
    found = [f for f in findings if f.rule == "client.model_route"]
    assert found and "no access" in found[0].what

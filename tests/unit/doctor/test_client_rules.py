"""The client rules from recorded answers (fixtures), for the branches a healthy server never shows."""

from __future__ import annotations

from pdfleet.doctor.anthropic_rules import ANTHROPIC_RULES
from pdfleet.doctor.client_rules import (
    CLIENT_RULES,
    base_url_problems,
    rule_base_url,
    rule_no_choices,
    rule_pool_port,
    rule_stream_mismatch,
    suggested_base_url,
)
from pdfleet.doctor.exchange import Exchange
from pdfleet.doctor.probe import ClientFacts, ScriptCall, key_shape
from tests.unit.doctor.helpers import fixture

ANSWERS = fixture("exchanges.yml")


def answer(probe: str, name: str, url: str = "http://h:8100/v1/x") -> Exchange:
    a = ANSWERS[name]
    return Exchange(
        probe,
        "GET",
        url,
        status=a["status"],
        response_headers=tuple(a["headers"].items()),
        response_body=a["body"],
    )


def facts(*exchanges: Exchange, base: str = "http://h:8100/v1", anthropic: bool = False) -> ClientFacts:
    return ClientFacts(base, anthropic, None, exchanges)


def test_base_url_shapes() -> None:
    assert base_url_problems("http://h:8080/v1", False) == []
    assert base_url_problems("http://h:8080", True) == []
    assert base_url_problems("http://h:8080/", False)[0].startswith("it does not end with /v1")
    assert "query string" in base_url_problems("http://h:8080/v1?x=1", False)[0]
    assert "endpoint 'chat/completions'" in base_url_problems("http://h/v1/chat/completions", False)[0]
    assert "appends /v1/messages" in base_url_problems("http://h:8080/v1", True)[0]
    assert "not an http(s) URL" in base_url_problems("h:8080", False)[0]
    assert suggested_base_url("http://h:8080/v1?x", False) == "http://h:8080/v1"
    assert suggested_base_url("http://h/api/v1/chat/completions", False) == "http://h/api/v1"
    assert suggested_base_url("http://h/api", False) == "http://h/api/v1"
    assert suggested_base_url("http://h:8080/v1/messages", True) == "http://h:8080"
    assert rule_base_url(facts(base="http://h:8080/v1")) == []


def test_the_gateway_is_not_a_pool_port() -> None:
    assert rule_pool_port(facts(answer("health", "gateway_health"))) == []


def test_a_vllm_instance_is_a_pool_port() -> None:
    found = rule_pool_port(
        facts(
            answer("health", "vllm_health"),
            answer("version", "vllm_version"),
            answer("models", "vllm_unauthorized"),
        )
    )
    assert found[0].rule == "client.pool_port" and "port 8100" in found[0].what
    assert "vLLM's own --api-key" in found[0].what and '"0.11.0"' in found[0].evidence


def test_no_choices_in_a_200_answer() -> None:
    assert rule_no_choices(facts(answer("chat", "chat_json"))) == []
    found = rule_no_choices(facts(answer("chat", "chat_without_choices")))
    assert found[0].rule == "client.no_choices"


def test_stream_where_json_was_asked_and_the_reverse() -> None:
    found = rule_stream_mismatch(facts(answer("chat", "chat_as_sse"), answer("chat_stream", "chat_json")))
    assert [f.subject for f in found] == ["chat", "chat_stream"]
    assert "answered a server-sent event stream" in found[0].what and "one JSON body" in found[1].what
    assert (
        rule_stream_mismatch(facts(answer("chat", "chat_json"), answer("chat_stream", "chat_as_sse"))) == []
    )


def test_every_rule_takes_probes_that_never_ran_or_got_no_answer() -> None:
    """A probe that was skipped (its exchange None) or whose connection failed (status None) reaches every
    rule: none may dereference it, and none may blame an answer that never came."""
    script = ScriptCall("completions", {"messages": [], "stream": True}, expects_stream=False)
    no_answer = tuple(
        Exchange(p, "GET", "http://h:8100/v1/x", error="connection refused")
        for p in ("health", "version", "models", "chat", "chat_stream", "messages", "script")
    )
    for anthropic in (False, True):
        for exchanges in ((), no_answer):
            seen = ClientFacts(
                "http://h:8100/v1", anthropic, key_shape("K", "sk-x"), exchanges, script=script
            )
            found = [f.rule for rule in (*CLIENT_RULES, *ANTHROPIC_RULES) for f in rule(seen)]
            assert "client.no_choices" not in found and "client.pool_port" not in found
            assert ("client.unreachable" in found) == bool(exchanges)
            # the script's own mismatch is read from the script, with no exchange to quote
            assert "client.stream_mismatch" in found


def test_a_version_answer_without_health_names_no_pool_port() -> None:
    assert rule_pool_port(facts(answer("version", "vllm_version"))) == []

"""The Anthropic rules from environments and recorded answers: each variable's branch."""

from __future__ import annotations

from pdfleet.doctor.anthropic_rules import rule_anthropic_auth, rule_anthropic_env
from pdfleet.doctor.exchange import Exchange
from pdfleet.doctor.probe import ClientFacts
from tests.unit.doctor.helpers import fixture

BASE = "http://h:8080"


def facts(env: dict[str, str | None], *exchanges: Exchange) -> ClientFacts:
    return ClientFacts(BASE, True, None, exchanges, env=env)


def rules(env: dict[str, str | None]) -> set[str]:
    return {f.rule for f in rule_anthropic_env(facts(env))}


def test_the_variables() -> None:
    ok = {"ANTHROPIC_BASE_URL": BASE + "/", "ANTHROPIC_API_KEY": "sk-…abcd", "ANTHROPIC_AUTH_TOKEN": None}
    assert rules(ok) == set()
    assert rules({**ok, "ANTHROPIC_BASE_URL": None}) == {"anthropic.base_url_unset"}
    assert rules({**ok, "ANTHROPIC_BASE_URL": "https://api.anthropic.com"}) == {"anthropic.base_url_wrong"}
    assert rules({**ok, "ANTHROPIC_API_KEY": None}) == {"anthropic.key_unset"}
    assert rules({**ok, "ANTHROPIC_AUTH_TOKEN": "sk-…wxyz"}) == {"anthropic.key_and_token"}
    assert rules({**ok, "ANTHROPIC_API_KEY": None, "ANTHROPIC_AUTH_TOKEN": "sk-…wxyz"}) == set()
    assert rule_anthropic_env(ClientFacts(BASE, False, None, ())) == []  # not the Anthropic view


def test_authentication_error() -> None:
    a = fixture("exchanges.yml")["anthropic_auth_error"]
    ex = Exchange(
        "messages",
        "POST",
        BASE + "/v1/messages",
        status=a["status"],
        response_headers=tuple(a["headers"].items()),
        response_body=a["body"],
    )
    found = rule_anthropic_auth(facts({}, ex))
    assert found[0].rule == "anthropic.authentication_error"
    assert "authentication_error: the API key is not valid" in found[0].what
    assert rule_anthropic_auth(facts({})) == []

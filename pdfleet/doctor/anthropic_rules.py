"""The Anthropic client's catalogue (`--anthropic`): ANTHROPIC_BASE_URL / ANTHROPIC_API_KEY /
ANTHROPIC_AUTH_TOKEN unset or wrong, and the gateway's `authentication_error` on /v1/messages.

The Anthropic SDK reads those variables itself (the key wins over the token when both are set) and
sends to api.anthropic.com when ANTHROPIC_BASE_URL is unset, so each variable is checked as it reads it.
"""

from __future__ import annotations

from pdfleet.doctor.client_rules import rule_pool_port, suggested_base_url
from pdfleet.doctor.finding import Finding
from pdfleet.doctor.probe import ClientFacts

# the alias list (Bearer) first: with a refused key no alias is known and /v1/messages is not tried
MESSAGE_PROBES = ("messages", "messages_stream", "messages_x_api_key", "models")


def _same_url(a: str, b: str) -> bool:
    return a.strip().rstrip("/") == b.strip().rstrip("/")


def rule_anthropic_env(facts: ClientFacts) -> list[Finding]:
    """ANTHROPIC_BASE_URL unset or not this base URL; neither key variable set; both set."""
    if not facts.anthropic:
        return []
    env, out = facts.env, []
    want = suggested_base_url(facts.base_url, True)
    base = env.get("ANTHROPIC_BASE_URL")
    if base is None:
        out.append(
            Finding(
                "anthropic.base_url_unset",
                "error",
                "ANTHROPIC_BASE_URL is unset: the Anthropic SDK and Claude Code send to api.anthropic.com",
                "ANTHROPIC_BASE_URL: (unset)",
                f"export ANTHROPIC_BASE_URL={want}",
                subject="ANTHROPIC_BASE_URL",
            )
        )
    elif not _same_url(base, facts.base_url):
        out.append(
            Finding(
                "anthropic.base_url_wrong",
                "error",
                f"ANTHROPIC_BASE_URL is {base}, not the gateway probed here ({facts.base_url})",
                f"ANTHROPIC_BASE_URL={base}",
                f"export ANTHROPIC_BASE_URL={want}",
                subject="ANTHROPIC_BASE_URL",
            )
        )
    key, token = env.get("ANTHROPIC_API_KEY"), env.get("ANTHROPIC_AUTH_TOKEN")
    if key is None and token is None:
        out.append(
            Finding(
                "anthropic.key_unset",
                "error",
                "neither ANTHROPIC_API_KEY nor ANTHROPIC_AUTH_TOKEN is set: the client sends no key",
                "ANTHROPIC_API_KEY: (unset)\nANTHROPIC_AUTH_TOKEN: (unset)",
                'export ANTHROPIC_API_KEY="$(cat ~/.config/pdfleet/gateway-client.key)" '
                "(the gateway's client key)",
                subject="ANTHROPIC_API_KEY",
            )
        )
    elif key is not None and token is not None and key != token:
        out.append(
            Finding(
                "anthropic.key_and_token",
                "warning",
                "ANTHROPIC_API_KEY and ANTHROPIC_AUTH_TOKEN are both set, to different keys: the SDK "
                "uses ANTHROPIC_API_KEY",
                f"ANTHROPIC_API_KEY={key}\nANTHROPIC_AUTH_TOKEN={token}",
                "unset the one that is not the gateway's client key",
                subject="ANTHROPIC_AUTH_TOKEN",
            )
        )
    return out


def rule_anthropic_auth(facts: ClientFacts) -> list[Finding]:
    """The gateway's 401 `authentication_error` on /v1/messages: the key is not one of its keys."""
    if not facts.anthropic or _pool(facts):
        return []
    ex = next((e for p in MESSAGE_PROBES if (e := facts.exchange(p)) is not None and e.status == 401), None)
    if ex is None:
        return []
    var = facts.key.var if facts.key is not None else "ANTHROPIC_API_KEY"
    kind = ex.error_type() or "HTTP 401"
    return [
        Finding(
            "anthropic.authentication_error",
            "error",
            f"/v1/messages answers {kind}: {ex.error_message() or 'the key is refused'}",
            ex.evidence(),
            f"set {var} to the gateway's client key (gateway.client_key_file, "
            "~/.config/pdfleet/gateway-client.key); it goes as x-api-key or as a Bearer token",
            subject=var,
        )
    ]


def _pool(facts: ClientFacts) -> bool:
    """A vLLM instance answers (rule_pool_port says so): its 401 is not the gateway's."""
    return bool(rule_pool_port(facts))


ANTHROPIC_RULES = (rule_anthropic_env, rule_anthropic_auth)

"""The client view end to end: gather (probe as the SDK would), run the client catalogue, say what passed."""

from __future__ import annotations

from collections.abc import Mapping

from pdfleet.doctor.anthropic_rules import ANTHROPIC_RULES
from pdfleet.doctor.client_rules import CLIENT_RULES
from pdfleet.doctor.finding import Finding
from pdfleet.doctor.probe import ClientFacts, ScriptCall, gather_client_facts
from pdfleet.doctor.report import run_rules


def diagnose_client(facts: ClientFacts) -> list[Finding]:
    """Every client rule over the facts; one `ok` finding naming the probes when none found a problem."""
    findings = run_rules((*CLIENT_RULES, *ANTHROPIC_RULES), facts)
    if not findings:
        probes = [e for e in facts.exchanges if e.probe not in ("health", "version")]
        evidence = "\n".join(f"{e.method} {e.url} → {e.status}: {e.outcome}" for e in probes)
        findings.append(
            Finding(
                "client.ok",
                "ok",
                f"{len(probes)} probes answered as the SDK expects",
                evidence,
                "",
                subject=facts.base_url,
            )
        )
    return findings


def check_client(
    base_url: str,
    key: str | None,
    key_var: str,
    anthropic: bool,
    environ: Mapping[str, str],
    model: str | None = None,
    script: ScriptCall | None = None,
    timeout: float = 10.0,
) -> tuple[ClientFacts, list[Finding]]:
    """Probe `base_url` and diagnose what was seen."""
    facts = gather_client_facts(base_url, key, key_var, anthropic, environ, model, script, timeout)
    return facts, diagnose_client(facts)

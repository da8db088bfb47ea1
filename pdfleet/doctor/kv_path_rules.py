"""The KV path of each prefill->decode pair as doctor findings (`invoke doctor --profile P --kv-path`).

The measurement is verify's (`invoke verify --kv-path`: the connector's library moves a buffer between the
pair's own processes and pdfleet.checks.kv_path gives the verdict with the fix); the task runs it and hands
each pair's outcome here as a `KvPathResult`. This module only turns those outcomes into findings (pure):
a pair that moved nothing or moved far below the link's floor is an error naming the stage and the fix, a
pair not probed says why, a pair that passed says its throughput.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pdfleet.doctor.finding import Finding

Outcome = Literal["pass", "fail", "skip"]
RULE = "kv.path"
MEASURED_BY = "invoke verify --kv-path (the connector's library between the pair's own processes)"


@dataclass(frozen=True)
class KvPathResult:
    """One pair's probe outcome: `summary` is what it measured or why it failed, `fix` what to change."""

    pair: str  # "prefill->decode", host names
    outcome: Outcome
    summary: str
    fix: str = ""


def rule_kv_path(results: Sequence[KvPathResult]) -> list[Finding]:
    """One finding per probed pair: error with the fix, ok with the throughput, ok naming why it was skipped;
    one ok finding when the topology has no prefill->decode pair."""
    if not results:
        return [Finding(RULE, "ok", "no prefill->decode pair to probe", "the topology has no P/D pool", "")]
    return [_finding(r) for r in results]


def _finding(result: KvPathResult) -> Finding:
    if result.outcome == "fail":
        return Finding(
            RULE,
            "error",
            f"{result.pair}: the KV path fails or is far below the link",
            f"{result.summary}\nmeasured by {MEASURED_BY}",
            result.fix or "see the probe's output: `invoke verify --profile P --kv-path --checks kv_path`",
            subject=result.pair,
        )
    if result.outcome == "skip":
        return Finding(
            RULE, "ok", f"{result.pair}: the KV path was not probed", result.summary, "", subject=result.pair
        )
    return Finding(
        RULE, "ok", f"{result.pair}: the KV path moves bytes", result.summary, "", subject=result.pair
    )

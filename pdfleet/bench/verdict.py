"""Does splitting prefill and decode pay on this traffic? The guide's rule as a pure function of the figures.

Split only if the colocated pool (chunked prefill on) cannot meet both the TTFT and the TPOT P95 bound,
both its prefill and its decode queue P95 exceed their thresholds (the pool is short of both phases,
not just mis-tuned), and the disaggregated pool meets both bounds. Every other case says why not and
what to try first. On a colocated pool one WAITING queue (`vllm:request_queue_time_seconds`) serves both
phases, so the same P95 is compared with both thresholds; on the P/D pool each role has its own.
A KV-transfer P95 over 200 ms is warned about whatever the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field

KV_WARN_MS = 200.0


@dataclass(frozen=True)
class PoolFigures:
    """What the rule reads of one pool (ms; None: the figure could not be measured)."""

    ttft_p95_ms: float | None
    tpot_p95_ms: float | None
    prefill_queue_p95_ms: float | None = None
    decode_queue_p95_ms: float | None = None
    kv_transfer_p95_ms: float | None = None
    failed: int = 0


@dataclass(frozen=True)
class Thresholds:
    """The profile's bounds (slo.ttft_bound_ms, tpot_bound_ms, prefill/decode_queue_p95_ms)."""

    ttft_p95_ms: float
    tpot_p95_ms: float
    prefill_queue_p95_ms: float
    decode_queue_p95_ms: float


@dataclass(frozen=True)
class Verdict:
    """The answer (`split`, `do not split` or `undecided`), the numbers that decided it, advice, warnings."""

    decision: str
    headline: str
    deciding: dict[str, float | None] = field(default_factory=dict)
    advice: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


TUNE_TTFT = (
    "TTFT misses its bound while TPOT meets it: give prefill more of each step "
    "(raise pools.colocated.max_num_batched_tokens), turn on prefix caching for repeated context"
)
TUNE_TPOT = (
    "TPOT misses its bound while TTFT meets it: lower pools.colocated.max_num_batched_tokens so "
    "prefill chunks hold decode steps up for less time"
)
CAPACITY = (
    "the colocated pool misses both bounds without long queues on both phases: the load is above "
    "what tuning can fix; add colocated GPUs or rate-limit at the gateway, and cap prompt length "
    "(prompt control) before splitting"
)
GENERAL = (
    "what to try before splitting: the chunked prefill budget (max_num_batched_tokens), prefix "
    "caching, rate limits at the gateway, prompt control (trim or cap long documents)"
)


def _meets(f: PoolFigures, t: Thresholds) -> tuple[bool | None, bool | None]:
    """Whether a pool meets the TTFT and TPOT bounds (None: not measured)."""
    ttft = None if f.ttft_p95_ms is None else f.ttft_p95_ms <= t.ttft_p95_ms
    tpot = None if f.tpot_p95_ms is None else f.tpot_p95_ms <= t.tpot_p95_ms
    return ttft, tpot


def _kv_warning(disagg: PoolFigures | None) -> list[str]:
    """The KV-transfer warning when the P/D pool's P95 is over 200 ms."""
    if disagg is None or disagg.kv_transfer_p95_ms is None or disagg.kv_transfer_p95_ms <= KV_WARN_MS:
        return []
    return [
        f"KV transfer P95 is {disagg.kv_transfer_p95_ms:.0f} ms (> {KV_WARN_MS:.0f} ms): the link between "
        "prefill and decode eats the TTFT budget; check the connector's transport (RDMA, not TCP), the "
        "NIC and GPUDirect before trusting the P/D figures"
    ]


def decide(colo: PoolFigures, disagg: PoolFigures | None, t: Thresholds) -> Verdict:
    """The rule (module docstring) on measured figures."""
    warnings = _kv_warning(disagg)
    deciding: dict[str, float | None] = {
        "colocated_ttft_p95_ms": colo.ttft_p95_ms,
        "ttft_p95_bound_ms": t.ttft_p95_ms,
        "colocated_tpot_p95_ms": colo.tpot_p95_ms,
        "tpot_p95_bound_ms": t.tpot_p95_ms,
    }
    ttft_ok, tpot_ok = _meets(colo, t)
    if ttft_ok is None or tpot_ok is None:
        return Verdict(
            "undecided",
            "undecided: the colocated pool's TTFT/TPOT could not be measured (no request succeeded)",
            deciding,
            [GENERAL],
            warnings,
        )
    if ttft_ok and tpot_ok:
        return Verdict(
            "do not split",
            f"do not split: colocated meets both bounds (TTFT P95 "
            f"{colo.ttft_p95_ms:.0f} <= {t.ttft_p95_ms:g} ms, TPOT P95 {colo.tpot_p95_ms:.1f} <= "
            f"{t.tpot_p95_ms:g} ms)",
            deciding,
            [GENERAL],
            warnings,
        )
    if ttft_ok != tpot_ok:
        tip = TUNE_TPOT if ttft_ok else TUNE_TTFT
        return Verdict(
            "do not split",
            "do not split yet: colocated misses only the "
            f"{'TPOT' if ttft_ok else 'TTFT'} bound; the chunked prefill budget trades one for the "
            "other",
            deciding,
            [tip, GENERAL],
            warnings,
        )
    deciding.update(
        {
            "colocated_prefill_queue_p95_ms": colo.prefill_queue_p95_ms,
            "prefill_queue_p95_threshold_ms": t.prefill_queue_p95_ms,
            "colocated_decode_queue_p95_ms": colo.decode_queue_p95_ms,
            "decode_queue_p95_threshold_ms": t.decode_queue_p95_ms,
        }
    )
    if colo.prefill_queue_p95_ms is None or colo.decode_queue_p95_ms is None:
        return Verdict(
            "undecided",
            "undecided: colocated misses both bounds but its queue times could not be "
            "read from the metrics source",
            deciding,
            [GENERAL],
            warnings,
        )
    queues_high = (
        colo.prefill_queue_p95_ms > t.prefill_queue_p95_ms
        and colo.decode_queue_p95_ms > t.decode_queue_p95_ms
    )
    if not queues_high:
        return Verdict(
            "do not split",
            "do not split: colocated misses both bounds, but its queues are not both long",
            deciding,
            [CAPACITY, GENERAL],
            warnings,
        )
    if disagg is None:
        return Verdict(
            "undecided",
            "undecided: colocated misses both bounds with both queues long, and no P/D "
            "pool was measured to compare",
            deciding,
            [GENERAL],
            warnings,
        )
    d_ttft, d_tpot = _meets(disagg, t)
    deciding.update({"disagg_ttft_p95_ms": disagg.ttft_p95_ms, "disagg_tpot_p95_ms": disagg.tpot_p95_ms})
    if d_ttft and d_tpot:
        return Verdict(
            "split",
            "split: colocated misses both bounds with both queues long, and the P/D pool "
            f"meets them (TTFT P95 {disagg.ttft_p95_ms:.0f} ms, TPOT P95 {disagg.tpot_p95_ms:.1f} ms)",
            deciding,
            ["move long prompts first: `invoke rollout --stage canary-long`"],
            warnings,
        )
    return Verdict(
        "do not split",
        "do not split: the P/D pool misses the bounds too at this load; splitting does not pay here",
        deciding,
        [CAPACITY, GENERAL],
        warnings,
    )

"""The promtool cases of the recording and alert rules: inputs written by hand, values worked out by hand.

Every recording rule an alert reads has a case here (tests/unit/monitoring/test_recording.py checks that
against the rendered alert files), and so do the gateway's event counters healthy traffic never moves
(errors, stream errors, fallbacks), which the loopback-stack test cannot see.
"""

from __future__ import annotations

from pdfleet.model.profile import Profile
from pdfleet.model.served import ServedModel
from pdfleet.monitoring.recording import kv_series
from tests.unit.monitoring.helpers import AlertCase, RuleCase, Series, buckets

# ---- quantiles: one shape per histogram, two instances summed, a second group kept apart ---------------

# The busy group's two instances, observations a second at or below each bound:
#   A: 0.5 → 0.3, 1 → 0.5, 2.5 → 0.6;  B: 0.5 → 0.2, 1 → 0.4, 2.5 → 0.4  (none at or below 0.1)
#   summed: 0.1 → 0, 0.5 → 0.5, 1 → 0.9, 2.5 → 1.0, +Inf → 1.0
#   p50: rank 0.5 falls in (0.1, 0.5]: 0.1 + 0.4 × 0.5/0.5 = 0.5
#   p95: rank 0.95 falls in (1, 2.5]: 1 + 1.5 × (0.95 − 0.9)/0.1 = 1.75
#   p99: rank 0.99 falls in (1, 2.5]: 1 + 1.5 × (0.99 − 0.9)/0.1 = 2.35
# (per instance, A's p99 would be 2.41 and B's 0.99: a rule that does not sum instances fails)
BUSY_A = {"0.1": 0.0, "0.5": 0.3, "1": 0.5, "2.5": 0.6, "+Inf": 0.6}
BUSY_B = {"0.1": 0.0, "0.5": 0.2, "1": 0.4, "2.5": 0.4, "+Inf": 0.4}
BUSY = {0.5: 0.5, 0.95: 1.75, 0.99: 2.35}
# The quiet group, one instance: 0.1 → 0.5, 0.5 → 1.0 (all)
#   p50: rank 0.5 in (0, 0.1]: 0.1 × 0.5/0.5 = 0.1;  p95: 0.1 + 0.4 × 0.45/0.5 = 0.46
#   p99: 0.1 + 0.4 × 0.49/0.5 = 0.492
QUIET_SHAPE = {"0.1": 0.5, "0.5": 1.0, "1": 1.0, "2.5": 1.0, "+Inf": 1.0}
QUIET = {0.5: 0.1, 0.95: 0.46, 0.99: 0.492}

VLLM_HISTOGRAMS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "queue": "vllm:request_queue_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
    "kv_transfer": "vllm:nixl_xfer_time_seconds",
    "decode": "vllm:request_decode_time_seconds",
    "tpot": "vllm:request_time_per_output_token_seconds",
    "itl": "vllm:inter_token_latency_seconds",
    "e2e": "vllm:e2e_request_latency_seconds",
}
GATEWAY_HISTOGRAMS = {
    "ttft": "pdfleet_gateway_ttft_seconds",
    "chunk_gap": "pdfleet_gateway_chunk_gap_seconds",
    "request": "pdfleet_gateway_request_duration_seconds",
}
VLLM_BUSY, VLLM_QUIET = 'pool="disagg", role="decode"', 'pool="colocated", role="colocated"'
GATEWAY_BUSY, GATEWAY_QUIET = 'pool="disagg", length_class="long"', 'pool="colocated", length_class="short"'


# the KV step reads the profile's connector's histogram: its case feeds both (a rule reads one of them)
KV_HISTOGRAMS = ("vllm:nixl_xfer_time_seconds", "vllm:mooncake_xfer_time_seconds")


def _quantile_cases(
    level: str, source: str, histograms: dict[str, str], busy: str, quiet: str
) -> list[RuleCase]:
    """Two models (issue 24): `big`'s busy group (two instances, summed) and quiet group, and `small`'s
    one instance in the busy group's pool, kept apart from `big`'s (merged, the busy P99 would move)."""
    cases = []
    for key, histogram in histograms.items():
        fed = KV_HISTOGRAMS if histogram in KV_HISTOGRAMS else (histogram,)
        inputs = tuple(
            series
            for name in fed
            for series in (
                *buckets(name, f'{busy}, instance="a:8000", model_name="m", model="big"', BUSY_A),
                *buckets(name, f'{busy}, instance="b:8000", model_name="m", model="big"', BUSY_B),
                *buckets(name, f'{quiet}, instance="c:8000", model_name="m", model="big"', QUIET_SHAPE),
                *buckets(name, f'{busy}, instance="d:8001", model_name="s", model="small"', QUIET_SHAPE),
            )
        )
        for q in (0.5, 0.95, 0.99):
            cases.append(
                RuleCase(
                    f"{level}:{source}_{key}_seconds:p{q * 100:g}",
                    "a wrong histogram, quantile or grouping (instances not summed, groups or models merged)",
                    inputs,
                    {
                        "{" + busy + ', model="big"}': BUSY[q],
                        "{" + quiet + ', model="big"}': QUIET[q],
                        "{" + busy + ', model="small"}': QUIET[q],
                    },
                )
            )
    return cases


# vLLM's and the gateway's series carry `model` (the target's model, the gateway's model group): kept apart
QUANTILE_CASES = _quantile_cases(
    "pool_role", "vllm", VLLM_HISTOGRAMS, VLLM_BUSY, VLLM_QUIET
) + _quantile_cases("pool_class", "gateway", GATEWAY_HISTOGRAMS, GATEWAY_BUSY, GATEWAY_QUIET)

# ---- the gateway's counters ------------------------------------------------------------------------------

REQ = "pdfleet_gateway_requests_total"
FALLBACKS = "pdfleet_gateway_fallbacks_total"
STREAM_ERRORS = "pdfleet_gateway_stream_errors_total"
STALLS = "pdfleet_gateway_stream_stalls_total"

GATEWAY_CASES = [
    RuleCase(
        "pool_class:gateway_errors:rate",
        "4xx counted as errors, or the pool/class grouping lost",
        (
            Series(f'{REQ}{{model="llama", pool="disagg", length_class="long", status="200"}}', per_s=2),
            Series(f'{REQ}{{model="llama", pool="disagg", length_class="long", status="502"}}', per_s=0.5),
            Series(f'{REQ}{{model="llama", pool="disagg", length_class="long", status="503"}}', per_s=0.25),
            Series(f'{REQ}{{model="llama", pool="disagg", length_class="long", status="429"}}', per_s=1),
            Series(
                f'{REQ}{{model="llama", pool="colocated", length_class="short", status="500"}}', per_s=0.125
            ),
            Series(f'{REQ}{{model="llama", pool="colocated", length_class="short", status="404"}}', per_s=3),
        ),
        # disagg/long: 502 + 503 = 0.5 + 0.25; colocated/short: the 500 only
        {
            '{model="llama", pool="disagg", length_class="long"}': 0.75,
            '{model="llama", pool="colocated", length_class="short"}': 0.125,
        },
    ),
    RuleCase(
        "pool:gateway_stream_errors:rate",
        "stream errors not summed over reasons and gateways, kept apart by reason, or models merged",
        (
            Series(
                f'{STREAM_ERRORS}{{instance="gw1:8080", model="big", pool="disagg", reason="upstream"}}',
                0.25,
            ),
            Series(
                f'{STREAM_ERRORS}{{instance="gw2:8080", model="small", pool="disagg", reason="timeout"}}',
                0.5,
            ),
            Series(
                f'{STREAM_ERRORS}{{instance="gw1:8080", pool="colocated", reason="timeout"}}',
                0.1,
            ),
        ),
        {
            '{model="big", pool="disagg"}': 0.25,
            '{model="small", pool="disagg"}': 0.5,
            '{pool="colocated"}': 0.1,
        },
    ),
    RuleCase(
        "reason:gateway_fallbacks:rate",
        "fallbacks not summed over classes, or reasons or models merged",
        (
            Series(f'{FALLBACKS}{{model="llama", length_class="long", reason="connect"}}', per_s=0.25),
            Series(f'{FALLBACKS}{{model="llama", length_class="short", reason="connect"}}', per_s=0.125),
            Series(f'{FALLBACKS}{{model="small", length_class="long", reason="status"}}', per_s=0.5),
            Series(f'{FALLBACKS}{{model="big", length_class="long", reason="status"}}', per_s=0.25),
        ),
        {
            '{model="llama", reason="connect"}': 0.375,
            '{model="small", reason="status"}': 0.5,
            '{model="big", reason="status"}': 0.25,
        },
    ),
    RuleCase(
        "fleet:gateway_fallback:ratio",
        "an inverted ratio (requests per fallback: 8), or a per-reason/pool one",
        (
            Series(f'{FALLBACKS}{{model="llama", length_class="long", reason="connect"}}', per_s=0.25),
            Series(f'{FALLBACKS}{{model="llama", length_class="long", reason="status"}}', per_s=0.25),
            Series(f'{REQ}{{model="llama", pool="colocated", length_class="long", status="200"}}', per_s=1.5),
            Series(f'{REQ}{{model="llama", pool="colocated", length_class="short", status="200"}}', per_s=2),
            Series(f'{REQ}{{model="llama", pool="disagg", length_class="long", status="502"}}', per_s=0.5),
        ),
        # (0.25 + 0.25) fallbacks / (1.5 + 2 + 0.5) requests a second
        {"{}": 0.125},
    ),
    RuleCase(
        "fleet:gateway_fallback:ratio",
        "an idle gateway must read 0, not NaN (the clamp_min on requests)",
        (
            Series(f'{FALLBACKS}{{model="llama", length_class="long", reason="connect"}}', per_s=0),
            Series(f'{REQ}{{model="llama", pool="colocated", length_class="short", status="200"}}', per_s=0),
        ),
        {"{}": 0.0},
    ),
    RuleCase(
        "pool_class:gateway_stream_stalls:per_min",
        "a rate a second instead of a minute, or gateways not summed",
        (
            Series(
                f'{STALLS}{{instance="gw1:8080", pool="colocated", length_class="long"}}',
                0.05,
            ),
            Series(
                f'{STALLS}{{instance="gw2:8080", pool="colocated", length_class="long"}}',
                0.025,
            ),
            Series(
                f'{STALLS}{{instance="gw1:8080", pool="disagg", length_class="long"}}',
                0,
            ),
        ),
        # (0.05 + 0.025) × 60
        {'{pool="colocated", length_class="long"}': 4.5, '{pool="disagg", length_class="long"}': 0.0},
    ),
]

# ---- vLLM's counters and gauges --------------------------------------------------------------------------

VLLM_CASES = [
    RuleCase(
        "pool_role:vllm_kv_cache_usage_perc:max",
        "the busiest instance's use, not the sum (0.6) or mean (0.3)",
        (
            Series('vllm:kv_cache_usage_perc{instance="p1:8100", pool="disagg", role="prefill"}', value=0.2),
            Series('vllm:kv_cache_usage_perc{instance="p2:8100", pool="disagg", role="prefill"}', value=0.4),
            Series('vllm:kv_cache_usage_perc{instance="d1:8200", pool="disagg", role="decode"}', value=0.9),
        ),
        {'{pool="disagg", role="prefill"}': 0.4, '{pool="disagg", role="decode"}': 0.9},
    ),
    RuleCase(
        "pool_role:vllm_num_preemptions:per_min",
        "a rate a second instead of a minute, or instances not summed",
        (
            Series(
                'vllm:num_preemptions_total{instance="d1:8200", pool="disagg", role="decode"}', per_s=0.05
            ),
            Series('vllm:num_preemptions_total{instance="d2:8200", pool="disagg", role="decode"}', per_s=0.1),
            Series(
                'vllm:num_preemptions_total{instance="c1:8000", pool="colocated", role="colocated"}',
                per_s=0.01,
            ),
        ),
        # decode: (0.05 + 0.1) × 60; colocated: 0.01 × 60
        {'{pool="disagg", role="decode"}': 9.0, '{pool="colocated", role="colocated"}': 0.6},
    ),
]

# The KV connector's failed transfers/s: NIXL's one counter; Mooncake's sender and receiver counters added,
# both exported (at 0 too) by every Mooncake instance, as vLLM registers them
KV_FAILURE_CASES = [
    RuleCase(
        "pool_role:vllm_nixl_failed_transfers:rate",
        "instances not summed",
        (
            Series(
                'vllm:nixl_num_failed_transfers_total{instance="d1:8200", pool="disagg", role="decode"}',
                per_s=0.1,
            ),
            Series(
                'vllm:nixl_num_failed_transfers_total{instance="d2:8200", pool="disagg", role="decode"}',
                per_s=0.2,
            ),
        ),
        {'{pool="disagg", role="decode"}': 0.3},
    ),
    RuleCase(
        "pool_role:vllm_mooncake_failed_transfers:rate",
        "one rate over both counters' names (duplicate label sets: Prometheus fails), or one left out",
        (
            Series(
                'vllm:mooncake_num_failed_transfers_total{instance="p1:8100", pool="disagg", role="prefill"}',
                per_s=0.1,
            ),
            Series('vllm:mooncake_num_failed_recvs_total{instance="p1:8100", pool="disagg", role="prefill"}'),
            Series(
                'vllm:mooncake_num_failed_transfers_total{instance="d1:8200", pool="disagg", role="decode"}'
            ),
            Series(
                'vllm:mooncake_num_failed_recvs_total{instance="d1:8200", pool="disagg", role="decode"}',
                per_s=0.2,
            ),
            Series(
                'vllm:mooncake_num_failed_recvs_total{instance="d2:8200", pool="disagg", role="decode"}',
                per_s=0.05,
            ),
        ),
        {'{pool="disagg", role="prefill"}': 0.1, '{pool="disagg", role="decode"}': 0.25},
    ),
]

RULE_CASES: list[RuleCase] = QUANTILE_CASES + GATEWAY_CASES + VLLM_CASES + KV_FAILURE_CASES

# ---- alerts: inputs on either side of the profile's own thresholds ---------------------------------------


def _above_and_below(histogram: str, hot: str, cold: str, limit_s: float) -> tuple[Series, ...]:
    """Observations of the hot labels all in (2×limit, 4×limit] (any quantile is over the limit), of the
    cold ones all in (0, limit/2] (any quantile is under it)."""
    return (
        *buckets(histogram, hot, {f"{2 * limit_s:g}": 0.0, f"{4 * limit_s:g}": 1.0, "+Inf": 1.0}),
        *buckets(histogram, cold, {f"{limit_s / 2:g}": 1.0, f"{4 * limit_s:g}": 1.0, "+Inf": 1.0}),
    )


def _scopes(profile: Profile) -> list[tuple[ServedModel, str]]:
    """Each model whose alerts render, and the label its series carry: `, model="NAME"` in a `models:`
    profile (its alerts select it), nothing for a single-model profile."""
    listed = bool(profile.models)
    return [(spec, f', model="{spec.name}"' if listed else "") for spec in profile.served]


def _slo_cases(profile: Profile, has_gateway: bool) -> list[AlertCase]:
    """Every model's series on either side of its own SLO, in one case per alert; with several models
    whose SLOs differ, also every model at one latency between the lowest and highest SLO: only the
    models with the lowest fire (a rule comparing one model with another's SLO fails one of the two)."""
    scopes = _scopes(profile)
    cases = []
    for alert, key in (
        ("PdfleetTTFTOverSLO", "ttft"),
        ("PdfleetTPOTOverSLO", "tpot"),
        ("PdfleetITLOverSLO", "itl"),
    ):
        gateway = key == "ttft" and has_gateway
        hist = GATEWAY_HISTOGRAMS[key] if gateway else VLLM_HISTOGRAMS[key]
        hot, cold = (GATEWAY_BUSY, GATEWAY_QUIET) if gateway else ('pool="disagg", role="decode"', VLLM_QUIET)
        prefill = 'pool="disagg", role="prefill"'
        inputs: list[Series] = []
        for spec, model in scopes:
            limit = getattr(spec.slo, f"{key}_p99_ms") / 1000
            inputs += _above_and_below(hist, hot + model, cold + model, limit)
            if not gateway:  # a prefill instance's TTFT (its whole request) is not the user's
                inputs += buckets(hist, prefill + model, {"1e+06": 0.0, "+Inf": 1.0})
        what = "TTFT" if key == "ttft" else key.upper()
        catches = f"{what} compared with the wrong SLO or direction, or the class or model labels lost"
        if not gateway:
            catches += ", or prefill instances counted"
        cases.append(AlertCase(alert, catches, tuple(inputs), tuple(hot + m for _, m in scopes)))
        limits = {m: getattr(spec.slo, f"{key}_p99_ms") / 1000 for spec, m in scopes}
        low, high = min(limits.values()), max(limits.values())
        if low < high:
            edges = {f"{low:g}": 0.0, f"{0.9 * high:g}": 1.0, "+Inf": 1.0}
            between = [buckets(hist, hot + m, edges) for m, limit in limits.items() if limit in (low, high)]
            cases.append(
                AlertCase(
                    alert,
                    f"a model's {what} compared with another model's SLO",
                    tuple(x for b in between for x in b),
                    tuple(hot + m for m, limit in limits.items() if limit == low),
                )
            )
    return cases


def _kv_cases(profile: Profile) -> list[AlertCase]:
    """The connector's own histogram, hot on the role that observes it (Mooncake: prefill), for every
    P/D model whose connector exports it, each against its own SLO."""
    roles = ('pool="disagg", role="decode"', 'pool="disagg", role="prefill"')
    slow: list[Series] = []
    over: list[Series] = []
    firing: list[str] = []
    for spec, model in _scopes(profile):
        series = kv_series(profile.for_model(spec))
        if series is None:  # no KV alerts render: nothing to transfer, or a release without the histogram
            continue
        hot, cold = roles if series.role == "decode" else roles[::-1]
        hist = series.histogram
        slow += _above_and_below(
            hist, hot + model, cold + model, profile.monitoring.kv_transfer_p95_ms / 1000
        )
        over += _above_and_below(hist, hot + model, cold + model, spec.slo.kv_transfer_p99_ms / 1000)
        firing.append(hot + model)
    if not firing:
        return []
    return [
        AlertCase("PdfleetKVTransferSlow", "the P95 against the wrong limit", tuple(slow), tuple(firing)),
        AlertCase("PdfleetKVTransferOverSLO", "the P99 against the wrong SLO", tuple(over), tuple(firing)),
    ]


def _engine_cases(profile: Profile) -> list[AlertCase]:
    return [c for spec, model in _scopes(profile) for c in _model_engine_cases(profile, spec, model)]


def _model_engine_cases(profile: Profile, spec: ServedModel, model: str) -> list[AlertCase]:
    mon = profile.monitoring
    cases = []
    if spec.pools.prefill is not None:
        prefill = 'pool="disagg", role="prefill"' + model
        queue = _above_and_below(
            VLLM_HISTOGRAMS["queue"],
            prefill,
            'pool="disagg", role="decode"' + model,
            mon.prefill_queue_p95_ms / 1000,
        )
        usage = "vllm:kv_cache_usage_perc{" + prefill + ', instance="p1"}'
        cases += [
            AlertCase(
                "PdfleetPrefillQueueWithIdleGPUs",
                "queue and KV use joined wrongly, or the wrong role",
                (*queue, Series(usage, value=mon.prefill_kv_usage_below / 2)),
                (prefill,),
            ),
            AlertCase(
                "PdfleetPrefillQueueWithIdleGPUs",
                "advice to raise the budget while the prefill KV cache is full (the GPUs are busy)",
                (*queue, Series(usage, value=(1 + mon.prefill_kv_usage_below) / 2)),
                (),
            ),
        ]
    per_s = mon.decode_preemptions_per_min / 60
    for pool in ("decode", "colocated"):
        if getattr(spec.pools, pool) is None:
            continue
        other = "colocated" if pool == "decode" else "decode"
        hot = f'pool="{"disagg" if pool == "decode" else "colocated"}", role="{pool}"{model}'
        cold = f'pool="{"disagg" if other == "decode" else "colocated"}", role="{other}"{model}'
        cases.append(
            AlertCase(
                f"Pdfleet{pool.capitalize()}Preemptions",
                "preemptions a second against a limit a minute, or the other pool's",
                (
                    Series(f'vllm:num_preemptions_total{{{hot}, instance="h1"}}', per_s=2 * per_s),
                    Series(f'vllm:num_preemptions_total{{{cold}, instance="h2"}}', per_s=per_s / 2),
                ),
                (hot,),
            )
        )
    return cases


def _gateway_cases(profile: Profile) -> list[AlertCase]:
    mon = profile.monitoring
    requests = Series(f'{REQ}{{model="llama", pool="colocated", length_class="long", status="200"}}', per_s=4)
    fallbacks = f'{FALLBACKS}{{model="llama", length_class="long", reason="connect"}}'
    stalls = mon.stalls_per_min / 60
    return [
        AlertCase(
            "PdfleetFallbacks",
            "an inverted ratio, or the limit compared the wrong way",
            (requests, Series(fallbacks, per_s=4 * 2 * mon.fallback_ratio)),
            ("",),
        ),
        AlertCase(
            "PdfleetFallbacks",
            "firing under the limit (an inverted ratio fires on every healthy fleet)",
            (requests, Series(fallbacks, per_s=4 * mon.fallback_ratio / 2)),
            (),
        ),
        AlertCase(
            "PdfleetStreamStalls",
            "stalls a second against a limit a minute, or the class labels lost",
            (
                Series(f'{STALLS}{{{GATEWAY_QUIET}, instance="gw1"}}', per_s=2 * stalls),
                Series(f'{STALLS}{{{GATEWAY_BUSY}, instance="gw1"}}', per_s=stalls / 2),
            ),
            (GATEWAY_QUIET,),
        ),
    ]


def alert_cases(profile: Profile, has_gateway: bool) -> list[AlertCase]:
    """A case for every alert the profile renders: over its own thresholds it fires, under them not."""
    target = AlertCase(
        "PdfleetTargetDown",
        "a target that answers taken for one that does not",
        (
            Series('up{job="vllm", instance="198.18.0.11:8000", host="p1"}', value=0),
            Series('up{job="vllm", instance="198.18.0.12:8000", host="d1"}', value=1),
        ),
        ('job="vllm", instance="198.18.0.11:8000", host="p1"',),
    )
    down = AlertCase(
        "PdfleetPoolDown",
        "one instance down taken for the pool down, or pools or roles summed together",
        (
            Series('up{job="vllm", model="m", pool="disagg", role="decode", host="d1"}', value=0),
            Series('up{job="vllm", model="m", pool="disagg", role="prefill", host="p1"}', value=1),
            Series('up{job="vllm", model="m", pool="colocated", role="colocated", host="c1"}', value=0),
            Series('up{job="vllm", model="m", pool="colocated", role="colocated", host="c2"}', value=1),
        ),
        ('model="m", pool="disagg", role="decode"',),
    )
    cases = [*_slo_cases(profile, has_gateway), *_kv_cases(profile), *_engine_cases(profile), target, down]
    return cases + (_gateway_cases(profile) + _certificate_cases(profile) if has_gateway else [])


def _certificate_cases(profile: Profile) -> list[AlertCase]:
    """Three gateways (promtool's clock starts at 0, so a notAfter is seconds from the test's start): one
    lapsing within warn_days fires; one lapsing after it, and a plain-HTTP one exporting 0, do not."""
    tls = profile.gateway.tls
    if isinstance(tls, str):
        return []
    day, name = 86400, "pdfleet_gateway_tls_certificate_expiry_timestamp_seconds"
    return [
        AlertCase(
            "PdfleetCertificateExpiry",
            "days compared as seconds or the bound inverted, or a plain-HTTP gateway's 0 read as lapsed",
            (
                Series(f'{name}{{job="pdfleet-gateway", host="gw1"}}', value=(tls.warn_days - 1) * day),
                Series(f'{name}{{job="pdfleet-gateway", host="gw2"}}', value=(tls.warn_days + 1) * day),
                Series(f'{name}{{job="pdfleet-gateway", host="gw3"}}', value=0),
            ),
            ('job="pdfleet-gateway", host="gw1"',),
        )
    ]

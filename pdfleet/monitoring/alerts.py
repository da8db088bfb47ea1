"""Alert rules from the profile's `slo:` and `monitoring:` sections, each saying what it means and what to
change in the profile's own terms (`pools.prefill.max_num_batched_tokens: 8192 → 16384`).

They read the recorded series of `pdfleet.monitoring.recording`, so an alert and the dashboard panel beside
it show the same number. The SLO targets are P99s (`slo.ttft_p99_ms`...), so the SLO alerts compare the
recorded P99 with them.

A profile with `models:` gets the per-model alerts (SLO, KV transfer, prefill queue, preemptions) once per
model: each selects its model's series (`model="NAME"`), compares them with that model's own settings
(`models[1].slo.ttft_p99_ms`, its pools' budgets in the advice) and names the model. A single-model
profile's alerts are what they were (no model selector: its gateway labels requests by alias).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from pdfleet.metrics.bounds import BUCKETS, judgeable
from pdfleet.model.profile import Profile
from pdfleet.model.served import ServedModel
from pdfleet.monitoring.recording import CHAIN, Step, kv_series


@dataclass(frozen=True)
class Alert:
    """One alert rule: name, condition, severity, and the two annotations operators read."""

    name: str
    expr: str
    summary: str
    action: str
    severity: str = "warning"
    model: str | None = None  # a listed model's alert: its label tells its rule from another model's

    def rule(self, for_s: int) -> dict[str, object]:
        labels = {"severity": self.severity, **({"model": self.model} if self.model else {})}
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": f"{for_s}s",
            "labels": labels,
            "annotations": {"summary": self.summary, "action": self.action},
        }


def _step(source: str, key: str) -> Step:
    return next(s for s in CHAIN if s.source == source and s.key == key)


def _ms(value: float) -> str:
    return f"{value:g} ms"


@dataclass(frozen=True)
class _Scope:
    """Whose alerts these are: the profile's one model (no selector) or one model of `models:`."""

    spec: ServedModel
    listed: bool  # a `models:` entry: select its series, name it, spell its key paths

    def sel(self, *matchers: str) -> str:
        """A series selector of the given matchers, plus `model="NAME"` for a listed model ('' if none)."""
        found = [*matchers, *([f'model="{self.spec.name}"'] if self.listed else [])]
        return "{" + ", ".join(found) + "}" if found else ""

    @property
    def of(self) -> str:
        """` of model NAME` in a summary (nothing for the only model)."""
        return f" of model {self.spec.name}" if self.listed else ""

    def key(self, path: str) -> str:
        """A key path as the profile spells it (`models[1].slo.ttft_p99_ms`)."""
        return self.spec.key(path) if self.listed else path

    def own(self, alerts: list[Alert]) -> list[Alert]:
        """The alerts labelled with a listed model's name (promtool refuses two rules of one name and
        labels: each model's rule must differ from the next model's by more than its expression)."""
        return [dataclasses.replace(a, model=self.spec.name) for a in alerts] if self.listed else alerts


def _scopes(profile: Profile) -> list[_Scope]:
    listed = bool(profile.models)
    return [_Scope(spec, listed) for spec in profile.served]


def slo_alerts(profile: Profile, has_gateway: bool) -> list[Alert]:
    """TTFT, TPOT and ITL P99 over the SLO, per pool (TTFT per class where the gateway runs); per model,
    each against its own SLO."""
    return [a for scope in _scopes(profile) for a in scope.own(_slo_alerts(scope, has_gateway))]


def _slo_alerts(scope: _Scope, has_gateway: bool) -> list[Alert]:
    slo = scope.spec.slo
    serving = scope.sel('role!="prefill"')  # a prefill instance's "TTFT" is its whole request
    ttft = (
        f"{_step('gateway', 'ttft').recorded(0.99)}{scope.sel()}"
        if has_gateway
        else f"{_step('vllm', 'ttft').recorded(0.99)}{serving}"
    )
    where = "{{ $labels.pool }} pool" + (", {{ $labels.length_class }} prompts" if has_gateway else "")
    return [
        Alert(
            "PdfleetTTFTOverSLO",
            f"{ttft} > {slo.ttft_p99_ms / 1000:g}",
            f"TTFT P99{scope.of} on the {where} is {{{{ $value | humanizeDuration }}}}, over "
            f"{scope.key('slo.ttft_p99_ms')} ({_ms(slo.ttft_p99_ms)}).",
            "Long prompts queue behind each other or behind decode: check the queue and prefill panels. "
            "Colocated: raise max_num_batched_tokens or move long prompts to the disaggregated pool "
            "(invoke rollout --stage long-prompts); disaggregated: add prefill GPUs (pools.prefill.gpus "
            "or tensor_parallel_size).",
        ),
        Alert(
            "PdfleetTPOTOverSLO",
            f"{_step('vllm', 'tpot').recorded(0.99)}{serving} > {slo.tpot_p99_ms / 1000:g}",
            f"TPOT P99{scope.of} on the {{{{ $labels.pool }}}} pool ({{{{ $labels.role }}}}) is "
            f"{{{{ $value | humanizeDuration }}}}, over {scope.key('slo.tpot_p99_ms')} "
            f"({_ms(slo.tpot_p99_ms)}).",
            "Decode batches are too large or share steps with prefills: lower max_num_seqs of the pool; "
            "on the colocated pool, long prefills stall decode (enable_chunked_prefill, a smaller "
            "max_num_batched_tokens, or the disaggregated pool for long prompts).",
        ),
        Alert(
            "PdfleetITLOverSLO",
            f"{_step('vllm', 'itl').recorded(0.99)}{serving} > {slo.itl_p99_ms / 1000:g}",
            f"ITL P99{scope.of} on the {{{{ $labels.pool }}}} pool ({{{{ $labels.role }}}}) is "
            f"{{{{ $value | humanizeDuration }}}}, over {scope.key('slo.itl_p99_ms')} "
            f"({_ms(slo.itl_p99_ms)}).",
            "Single steps take too long: a prefill chunk inside decode steps (colocated) or preemption. "
            "Lower max_num_batched_tokens on the colocated pool or route long prompts to the "
            "disaggregated pool; see the preemption panel.",
        ),
    ]


def kv_alerts(profile: Profile) -> list[Alert]:
    """KV transfer P95 over the guide's 200 ms, and P99 over slo.kv_transfer_p99_ms: per P/D model whose
    connector exports its histogram on the pinned release."""
    return [
        a
        for scope in _scopes(profile)
        if kv_series(profile.for_model(scope.spec)) is not None
        for a in scope.own(_kv_alerts(profile, scope))
    ]


def _kv_alerts(profile: Profile, scope: _Scope) -> list[Alert]:
    kv = _step("vllm", "kv_transfer")
    mon, slo = profile.monitoring, scope.spec.slo
    fix = (
        "Check the link: invoke verify (ib_write_bw against rdma.min_bandwidth_gbps), rdma.mtu, "
        "gpu.gpudirect (dmabuf/peermem, else transfers bounce through host memory) and "
        "kv_transfer.buffer_device; on a same-host pair the PCIe/NVLink path."
    )
    return [
        Alert(
            "PdfleetKVTransferSlow",
            f"{kv.recorded(0.95)}{scope.sel()} > {mon.kv_transfer_p95_ms / 1000:g}",
            f"KV transfer P95{scope.of} on {{{{ $labels.role }}}} instances is "
            "{{ $value | humanizeDuration }}, over "
            f"monitoring.kv_transfer_p95_ms ({_ms(mon.kv_transfer_p95_ms)}): the transport is the "
            "bottleneck.",
            fix,
            severity="critical",
        ),
        Alert(
            "PdfleetKVTransferOverSLO",
            f"{kv.recorded(0.99)}{scope.sel()} > {slo.kv_transfer_p99_ms / 1000:g}",
            f"KV transfer P99{scope.of} on {{{{ $labels.role }}}} instances is "
            "{{ $value | humanizeDuration }}, over "
            f"{scope.key('slo.kv_transfer_p99_ms')} ({_ms(slo.kv_transfer_p99_ms)}).",
            fix,
        ),
    ]


def engine_alerts(profile: Profile) -> list[Alert]:
    """The guide's tuning signals: prefill queue with idle prefill GPUs, and frequent decode preemption;
    per model, its advice in its own pools' terms."""
    return [a for scope in _scopes(profile) for a in scope.own(_engine_alerts(profile, scope))]


def _engine_alerts(profile: Profile, scope: _Scope) -> list[Alert]:
    mon = profile.monitoring
    out = []
    pools = scope.spec.pools
    prefill = pools.prefill
    if prefill is not None:
        budget = prefill.max_num_batched_tokens
        tp = prefill.tensor_parallel_size
        step = _step("vllm", "queue")
        queue = step.recorded(0.95)
        # a bound inside the queue histogram's first bucket is held to that bucket's bound (metrics.bounds)
        bound_s = judgeable(mon.prefill_queue_p95_ms / 1000, BUCKETS.get(step.histogram, ()))
        raised = (
            f" (monitoring.prefill_queue_p95_ms, {mon.prefill_queue_p95_ms:g} ms, is inside the queue "
            f"histogram's first bucket: held to its bound, {1000 * bound_s:g} ms)"
            if bound_s * 1000 > mon.prefill_queue_p95_ms
            else ""
        )
        key = scope.key("pools.prefill")
        on_prefill = scope.sel('role="prefill"')
        out.append(
            Alert(
                "PdfleetPrefillQueueWithIdleGPUs",
                f"{queue}{on_prefill} > {bound_s:g} and on (model, pool, role) "
                f"pool_role:vllm_kv_cache_usage_perc:max{on_prefill} < {mon.prefill_kv_usage_below:g}",
                f"Prefill requests{scope.of} wait {{{{ $value | humanizeDuration }}}} (P95){raised} "
                f"while the prefill instances' KV cache is under monitoring.prefill_kv_usage_below "
                f"({mon.prefill_kv_usage_below:g}): the token budget per step, not the GPUs, limits prefill "
                "(vLLM exports no GPU utilisation; KV cache use stands in for it).",
                f"Raise {key}.max_num_batched_tokens: {budget} → {budget * 2}, or give the prefill "
                f"pool more GPUs per instance ({key}.tensor_parallel_size: {tp} → {tp * 2}).",
            )
        )
    for pool in ("decode", "colocated"):
        spec = getattr(pools, pool)
        if spec is None:
            continue
        seqs = spec.max_num_seqs
        key = scope.key(f"pools.{pool}")
        on_pool = scope.sel(f'role="{pool}"')
        out.append(
            Alert(
                f"Pdfleet{pool.capitalize()}Preemptions",
                f"pool_role:vllm_num_preemptions:per_min{on_pool} > {mon.decode_preemptions_per_min:g}",
                f"The {pool} instances{scope.of} preempt {{{{ $value | humanize }}}} requests a minute (over "
                f"monitoring.decode_preemptions_per_min, {mon.decode_preemptions_per_min:g}): the KV cache "
                "runs out and requests are recomputed.",
                f"Lower {key}.max_num_seqs: {seqs} → {max(1, seqs // 2)}, or store the KV cache in "
                f"fp8 ({key}.kv_cache_dtype: {spec.kv_cache_dtype} → fp8), or raise "
                f"{key}.gpu_memory_utilization (now {spec.gpu_memory_utilization:g}).",
            )
        )
    return out


def gateway_alerts(profile: Profile) -> list[Alert]:
    """Fallbacks to the colocated pool and stream stalls, from the gateway's own counters."""
    mon = profile.monitoring
    return [
        Alert(
            "PdfleetFallbacks",
            f"fleet:gateway_fallback:ratio > {mon.fallback_ratio:g}",
            "{{ $value | humanizePercentage }} of requests fell back to the colocated pool (over "
            f"monitoring.fallback_ratio, {mon.fallback_ratio:g}): the disaggregated pool fails before "
            "the first byte.",
            "Look at the router and the prefill/decode units (journalctl -u vllm-router-pd, invoke doctor); "
            "until fixed, move traffic back: invoke rollout --stage colocated.",
        ),
        Alert(
            "PdfleetStreamStalls",
            f"pool_class:gateway_stream_stalls:per_min > {mon.stalls_per_min:g}",
            "{{ $value | humanize }} streams a minute stall on the {{ $labels.pool }} pool "
            "({{ $labels.length_class }} prompts), over monitoring.stalls_per_min "
            f"({mon.stalls_per_min:g}): the typewriter stops.",
            "On the colocated pool, long prefills stall decode: send long prompts to the disaggregated "
            "pool (invoke rollout --stage long-prompts) or lower pools.colocated.max_num_batched_tokens.",
        ),
    ]


def target_alerts() -> list[Alert]:
    """A scrape target that does not answer: every other alert is blind for it."""
    return [
        Alert(
            "PdfleetTargetDown",
            "up == 0",
            "{{ $labels.job }} on {{ $labels.host }} ({{ $labels.instance }}) does not answer scrapes.",
            "systemctl status on that host (invoke verify); its alerts cannot fire while it is down.",
            severity="critical",
        )
    ]


def pool_alerts() -> list[Alert]:
    """Every instance of a model's pool role down: the pool serves nothing. Alertmanager inhibits the pool's
    other alerts while this one fires (pdfleet.monitoring.alertmanager_config)."""
    return [
        Alert(
            "PdfleetPoolDown",
            'sum by (model, pool, role) (up{job="vllm"}) == 0',
            "Every {{ $labels.role }} instance of model {{ $labels.model }} on the {{ $labels.pool }} pool "
            "is down: the pool serves nothing (its other alerts are held back while it is down).",
            "systemctl status and journalctl -u of the pool's vllm units on its hosts (invoke verify, invoke "
            "doctor --profile); while the disaggregated pool is down the gateway falls back to the colocated "
            "pool, and invoke rollout --stage colocated sends it nothing.",
            severity="critical",
        )
    ]


CERT_EXPIRY = "pdfleet_gateway_tls_certificate_expiry_timestamp_seconds"  # its notAfter; 0 in plain HTTP


def certificate_alerts(profile: Profile) -> list[Alert]:
    """The gateway's TLS certificate lapsing within gateway.tls.warn_days (or lapsed): from the notAfter
    each gateway exports, so a renewal that reached the gateway (a reload) resolves it. None in plain HTTP."""
    tls = profile.gateway.tls
    if isinstance(tls, str):
        return []
    return [
        Alert(
            "PdfleetCertificateExpiry",
            f"{CERT_EXPIRY} - time() < {tls.warn_days * 86400} and {CERT_EXPIRY} > 0",
            "The gateway's TLS certificate on {{ $labels.host }} lapses in {{ $value | humanizeDuration }} "
            f"(gateway.tls.warn_days: {tls.warn_days}); once it has, every client refuses the gateway.",
            "Renew it from the site's PKI into gateway.tls.cert_file and key_file, then invoke provision "
            "--roles gateway (a reload: streams in flight finish); invoke verify shows every gateway's "
            "expiry.",
        )
    ]


def alert_rules(profile: Profile, has_gateway: bool) -> dict[str, object]:
    """The alerts file: one group, every alert with the profile's `for:`."""
    alerts = slo_alerts(profile, has_gateway)
    alerts += kv_alerts(profile)
    alerts += engine_alerts(profile)
    if has_gateway:
        alerts += gateway_alerts(profile) + certificate_alerts(profile)
    alerts += pool_alerts() + target_alerts()
    for_s = profile.monitoring.alert_for_s
    interval = f"{profile.monitoring.evaluation_interval_s}s"
    return {
        "groups": [{"name": "pdfleet-alerts", "interval": interval, "rules": [a.rule(for_s) for a in alerts]}]
    }

"""Tuning advice from metrics: prefill under-used while its queue is high, and frequent decode preemption.

Figures come through the one `MetricsSource` (Prometheus or a direct scrape), under the metric names the
pinned release registers (`pdfleet.model.vllm_release_data`); the thresholds are the profile's
`monitoring:` ones the alert rules use, so doctor and the alerts agree. The rules are pure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial

from pdfleet.doctor.finding import Finding, profile_fix
from pdfleet.doctor.fleet_facts import RoleFigures
from pdfleet.metrics.source import MetricsError, MetricsSource, Result
from pdfleet.model.profile import MAX_GPU_MEMORY_UTILIZATION, Profile
from pdfleet.model.vllm_releases import Release

QUEUE = "vllm:request_queue_time_seconds"
WAITING = "vllm:num_requests_waiting"
PREEMPTIONS = "vllm:num_preemptions"  # a counter: exposed as vllm:num_preemptions_total
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # newer name first
# gpu_memory_utilization above this leaves too little for NIXL/UCX transfer buffers and CUDA graphs
KV_BUFFER_HEADROOM_MAX = 0.95
UTILIZATION_STEP = 0.05


def kv_usage_metric(release: Release) -> str:
    """The KV-cache usage gauge this release registers."""
    names = release.metric_names(include_conditional=True)
    return next(n for n in KV_USAGE if n in names)


def _read(what: str, read: Callable[[], Result], missing: list[str]) -> Result | None:
    """A source's answer, or None with why appended to `missing` (never a zero)."""
    try:
        return read()
    except MetricsError as exc:
        missing.append(f"{what}: {exc}")
        return None


def gather_figures(
    source: MetricsSource,
    release: Release,
    roles: Mapping[str, int],
    window_s: float,
    model: str | None = None,
) -> dict[str, RoleFigures]:
    """Per role (with its instance count): queue P95, waiting, mean KV use, preemptions a minute; of one
    model's instances (their `model` label) or, None, of every instance."""
    for name in (QUEUE, WAITING, PREEMPTIONS):
        release.metric(name)  # a name the release does not register is a bug here, not a zero
    kv = kv_usage_metric(release)
    by = ("role",)
    out = {}
    for role, count in roles.items():
        match = {"role": role} | ({"model": model} if model else {})
        missing: list[str] = []
        queue = _read("queue P95", partial(source.quantile, 0.95, QUEUE, window_s, by, match), missing)
        waiting = _read("waiting", partial(source.value, WAITING, by, match), missing)
        usage = _read("KV cache use", partial(source.value, kv, by, match), missing)
        preempt = _read(
            "preemptions", partial(source.rate, PREEMPTIONS + "_total", window_s, by, match), missing
        )
        out[role] = RoleFigures(
            role,
            max(queue.values()) if queue else None,
            sum(waiting.values()) if waiting else None,
            sum(usage.values()) / max(count, 1) if usage else None,  # the gauge summed: the mean per instance
            sum(preempt.values()) * 60 if preempt else None,
            tuple(missing),
        )
    return out


def _fmt(value: float | None, unit: str = "") -> str:
    return "n/a" if value is None else f"{value:.3g}{unit}"


def _key(profile: Profile, path: str) -> str:
    """A key path of the model a rule reads (`profile`: one model's view, Profile.for_model, or a
    single-model profile) as its file spells it: `models[1].pools.decode.max_num_seqs` in a list."""
    return profile.served[0].key(path)


def _scope(profile: Profile, pool: str) -> tuple[str, str]:
    """(title prefix, subject) of a finding about a pool of the model a rule reads: `model NAME: ` and
    `NAME/pool` for a model of a `models:` list, nothing and the pool otherwise."""
    spec = profile.served[0]
    return (f"model {spec.name}: ", f"{spec.name}/{pool}") if spec.listed else ("", pool)


def rule_prefill_queue(profile: Profile, figures: Mapping[str, RoleFigures]) -> list[Finding]:
    """Prefill requests queue (P95 over monitoring.prefill_queue_p95_ms) while the prefill KV cache is mostly
    free (under monitoring.prefill_kv_usage_below): the per-step token budget limits prefill, not the GPUs."""
    spec, fig = profile.pools.prefill, figures.get("prefill")
    if spec is None or fig is None or fig.queue_p95_s is None or fig.kv_usage is None:
        return []
    mon = profile.monitoring
    if fig.queue_p95_s * 1000 <= mon.prefill_queue_p95_ms or fig.kv_usage >= mon.prefill_kv_usage_below:
        return []
    budget, tp = spec.max_num_batched_tokens, spec.tensor_parallel_size
    budget_key, tp_key = _key(profile, "pools.prefill.max_num_batched_tokens"), _key(profile, "pools.prefill")
    model, subject = _scope(profile, "prefill")
    evidence = (
        f"{QUEUE} P95 = {_fmt(fig.queue_p95_s, ' s')} (over {mon.prefill_queue_p95_ms:g} ms); "
        f"{WAITING} = {_fmt(fig.waiting)}; KV cache use = {_fmt(fig.kv_usage)} "
        f"(under {mon.prefill_kv_usage_below:g}): prefill GPUs under-used"
    )
    diff = profile_fix(profile, [(budget_key, budget, budget * 2)])
    return [
        Finding(
            "tuning.prefill_queue",
            "warning",
            f"{model}prefill requests queue while the prefill GPUs are under-used: the token budget per "
            "step limits prefill",
            evidence,
            f"raise {budget_key} {budget} → {budget * 2}, or the prefill TP size "
            f"({tp_key}.tensor_parallel_size {tp} → {tp * 2}); then invoke provision",
            diff,
            subject=subject,
        )
    ]


def rule_preemption(profile: Profile, figures: Mapping[str, RoleFigures]) -> list[Finding]:
    """Decode (or colocated) instances preempt more than monitoring.decode_preemptions_per_min: the KV cache
    runs out. Lower max_num_seqs or store KV in fp8; raise gpu_memory_utilization only with headroom left."""
    out = []
    limit = profile.monitoring.decode_preemptions_per_min
    for pool in ("decode", "colocated"):
        spec, fig = getattr(profile.pools, pool), figures.get(pool)
        if spec is None or fig is None or fig.preemptions_per_min is None or fig.preemptions_per_min <= limit:
            continue
        seqs, util = spec.max_num_seqs, spec.gpu_memory_utilization
        at = _key(profile, f"pools.{pool}")
        changes: list[tuple[str, object, object]] = [(f"{at}.max_num_seqs", seqs, max(1, seqs // 2))]
        fix = [f"lower {at}.max_num_seqs {seqs} → {max(1, seqs // 2)}"]
        if not spec.kv_cache_dtype.startswith("fp8"):
            changes.append((f"{at}.kv_cache_dtype", spec.kv_cache_dtype, "fp8"))
            fix.append(f"or store the KV cache in fp8 ({at}.kv_cache_dtype {spec.kv_cache_dtype} → fp8)")
        raised = round(util + UTILIZATION_STEP, 2)
        if raised <= min(KV_BUFFER_HEADROOM_MAX, MAX_GPU_MEMORY_UTILIZATION):
            fix.append(
                f"or raise {at}.gpu_memory_utilization {util:g} → {raised:g} (still leaves "
                f"{1 - raised:.0%} for the KV transfer buffers)"
            )
        else:
            fix.append(f"not gpu_memory_utilization: {util:g} leaves no headroom for the KV transfer buffers")
        evidence = (
            f"{PREEMPTIONS}_total: {_fmt(fig.preemptions_per_min)} a minute (over {limit:g}); "
            f"KV cache use = {_fmt(fig.kv_usage)}; {WAITING} = {_fmt(fig.waiting)}"
        )
        model, subject = _scope(profile, pool)
        out.append(
            Finding(
                f"tuning.{pool}_preemption",
                "warning",
                f"{model}the {pool} instances preempt requests often: the KV cache runs out of blocks",
                evidence,
                "; ".join(fix),
                profile_fix(profile, changes),
                subject=subject,
            )
        )
    return out


def rule_metrics_read(source: str, figures: Mapping[str, RoleFigures]) -> list[Finding]:
    """Figures that could not be read: said plainly, never taken for zero."""
    missing = [f"{role}: {m}" for role, fig in figures.items() for m in fig.missing]
    if not missing:
        return []
    return [
        Finding(
            "metrics.unread",
            "warning",
            "some metric figures could not be read; their rules did not run",
            f"{source}\n" + "\n".join(missing[:8]),
            "check the metrics endpoints answer (or Prometheus "
            "scrapes them: invoke monitor); an idle pool has no histogram observations yet",
            subject=source,
        )
    ]


METRICS_RULES = (rule_prefill_queue, rule_preemption)

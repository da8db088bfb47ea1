"""What a deployment says for `invoke plan`, `--validate` and the plan benchmarks: the targets of its slo,
the GPU kind, model and link its pools run with, and the pools it serves today.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pdfleet.fleet.deployment import Deployment
    from pdfleet.model.profile import SloSpec
    from pdfleet.plan.decide import Targets
    from pdfleet.plan.diff import Current
    from pdfleet.plan.space import Hardware


def targets_of(slo: SloSpec) -> Targets:
    """What a layout must meet: the verdict's P95 bounds and queue thresholds, the P99s, attainment."""
    from pdfleet.plan.decide import Targets

    return Targets(
        slo.ttft_bound_ms,
        slo.tpot_bound_ms,
        slo.itl_p99_ms,
        slo.kv_transfer_p99_ms,
        slo.attainment_pct,
        slo.prefill_queue_p95_ms,
        slo.decode_queue_p95_ms,
    )


def hardware_of(deployment: Deployment, model: str | None) -> Hardware:
    """The GPU kind, model, KV link and memory settings the profile's pools run with."""
    from pdfleet.bench.fleet_targets import bench_model
    from pdfleet.model import catalog
    from pdfleet.plan.space import Hardware

    spec = bench_model(deployment.profile, model)
    sim = deployment.profile.vllm.sim
    pool = next((spec.pools.get(p) for p, _ in spec.pools.items() if p in ("colocated", "decode")), None)
    dtype = pool.kv_cache_dtype if pool is not None else "auto"
    hw_model = catalog.model(spec.model.id)
    return Hardware(
        catalog.gpu(sim.gpu),
        hw_model,
        catalog.link(sim.link),
        gpu_memory_utilization=pool.gpu_memory_utilization if pool is not None else 0.9,
        max_model_len=spec.model.max_model_len or hw_model.max_model_len,
        kv_dtype_bytes=catalog.KV_CACHE_DTYPES.get(dtype),
    )


def current_of(deployment: Deployment, model: str | None) -> Current:
    """Today's pools (instances from the inventory, TP and budget from the profile), threshold, stage."""
    from pdfleet.bench.fleet_targets import bench_model
    from pdfleet.plan.diff import Current
    from pdfleet.plan.space import PoolShape

    spec = bench_model(deployment.profile, model)
    pools: dict[str, PoolShape | None] = {}
    for name in ("prefill", "decode", "colocated"):
        n = len(deployment.topology.pool(name, spec.name))
        ps = spec.pools.get(name) if n else None
        pools[name] = PoolShape(n, ps.tensor_parallel_size, ps.max_num_batched_tokens) if ps else None
    gw = deployment.profile.for_model(spec).gateway
    return Current(pools, gw.long_prompt_tokens, gw.stage)

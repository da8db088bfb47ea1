"""The layouts `invoke plan` searches for N GPUs, and the ones it cuts before simulating, with the reason.

A layout spends every GPU: colocated instances only, or x prefill and y decode instances (each pool with
its own tensor-parallel size and token budget) plus, when GPUs are left, colocated instances that keep the
prompts under the long-prompt threshold (the gateway's `long_prompt_tokens`, on effective tokens). Pure:
no clock, no files; the traffic enters as a `Load` (the few averages the cuts need).

Cuts, each with its figures: the model does not fit a GPU share at that TP (weights and vLLM's reserve
past `gpu_memory_utilization`, or a KV cache smaller than `max_model_len`, vLLM's own start-up refusals);
the KV link cannot carry the transfer rate (a decode instance's link busy >= 100% of the time); the KV
cache cannot hold the decode batch (Little's law at the SLO's TPOT: requests decoding at once × their
context > the pool's KV tokens).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from pdfleet.model.catalog import (
    DEFAULT_BLOCK_SIZE,
    GIB,
    NON_KV_RESERVE_BYTES,
    GpuRoofline,
    LinkSpec,
    ModelShape,
)

TP_SIZES = (1, 2, 4, 8)
COLOCATED_BUDGETS = (2048, 8192)  # vLLM's ITL-leaning budget, and its default on a >= 70 GiB GPU
PREFILL_BUDGETS = (8192, 16384)  # a prefill instance runs no decodes beside its chunks: larger pays in TTFT
DECODE_BUDGETS = (2048,)  # a decode instance computes one token per request (and each KV's last token)
THRESHOLDS = (4096, 8192, 16384)  # long_prompt_tokens tried where colocated instances stay beside P/D


@dataclass(frozen=True)
class PoolShape:
    """One pool of a layout: instances, each on `tp` GPUs, with its token budget per step."""

    instances: int
    tp: int
    budget: int

    @property
    def gpus(self) -> int:
        return self.instances * self.tp

    def label(self, role: str) -> str:
        """`2C tp1 b8192`: instances, role letter, TP and budget."""
        return f"{self.instances}{role} tp{self.tp} b{self.budget}"


@dataclass(frozen=True)
class Layout:
    """Pools of one candidate; `threshold` sends prompts with at least that many effective tokens to P/D
    (None: one kind of pool, nothing to choose)."""

    colocated: PoolShape | None = None
    prefill: PoolShape | None = None
    decode: PoolShape | None = None
    threshold: int | None = None

    @property
    def gpus(self) -> int:
        return sum(p.gpus for p in (self.colocated, self.prefill, self.decode) if p is not None)

    @property
    def kind(self) -> str:
        """`colocated`, `disagg` (P/D only) or `hybrid` (P/D for long prompts, colocated for the rest)."""
        if self.prefill is None:
            return "colocated"
        return "hybrid" if self.colocated is not None else "disagg"

    @property
    def name(self) -> str:
        parts = [
            p.label(role)
            for p, role in ((self.prefill, "P"), (self.decode, "D"), (self.colocated, "C"))
            if p is not None
        ]
        tail = f" long>={self.threshold}" if self.threshold is not None else ""
        return " + ".join(parts) + tail


@dataclass(frozen=True)
class Hardware:
    """What a GPU share can hold and move: the GPU, the model, the KV link and vLLM's memory settings."""

    gpu: GpuRoofline
    model: ModelShape
    link: LinkSpec
    gpu_memory_utilization: float = 0.9
    max_model_len: int = 32768
    kv_dtype_bytes: int | None = None

    @property
    def kv_bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token(self.kv_dtype_bytes)

    def kv_tokens(self, tp: int) -> int:
        """KV cache tokens of one instance on `tp` GPUs (as the simulator sizes it: whole blocks); <= 0 when
        the weights and the reserve do not fit."""
        free = self.gpu_memory_utilization * self.gpu.memory_bytes - self.model.weight_bytes / tp
        free -= NON_KV_RESERVE_BYTES
        block = DEFAULT_BLOCK_SIZE * self.kv_bytes_per_token / tp
        return int(free // block) * DEFAULT_BLOCK_SIZE if free > 0 else 0


@dataclass(frozen=True)
class Load:
    """The traffic's averages the cuts need: requests/s, mean prompt and output tokens of all requests,
    and for each threshold tried the share of requests at or past it and their mean prompt tokens."""

    rate: float
    prompt_mean: float
    output_mean: float
    long: dict[int, tuple[float, float]]  # threshold -> (share of requests, their mean prompt tokens)
    tpot_s: float  # the SLO's TPOT: how fast a decode batch must move (Little's law's time per token)


@dataclass(frozen=True)
class Pruned:
    """A layout cut before simulating, and why (with the figures)."""

    layout: Layout
    reason: str


def fits(hw: Hardware, tp: int) -> str | None:
    """Why the model cannot run on `tp` GPUs of this kind (vLLM's start-up refusals), or None."""
    if hw.model.heads % tp:
        return f"{hw.model.name} has {hw.model.heads} attention heads, not divisible by TP {tp}"
    tokens = hw.kv_tokens(tp)
    if tokens <= 0:
        need = (hw.model.weight_bytes / tp + NON_KV_RESERVE_BYTES) / GIB
        have = hw.gpu_memory_utilization * hw.gpu.memory_bytes / GIB
        return f"model does not fit: {need:.1f} GiB per GPU at TP {tp} > {have:.1f} GiB on {hw.gpu.name}"
    if tokens < hw.max_model_len:
        return f"model does not fit: KV cache {tokens} tokens at TP {tp} < max_model_len {hw.max_model_len}"
    return None


def _splits(gpus: int, tps: Sequence[int]) -> Iterator[tuple[int, int]]:
    """(instances, tp) using exactly `gpus` GPUs."""
    for tp in tps:
        if gpus % tp == 0 and gpus >= tp:
            yield gpus // tp, tp


def candidates(gpus: int, tps: Sequence[int] = TP_SIZES) -> Iterator[Layout]:
    """Every layout of exactly `gpus` GPUs over the TP sizes, budgets and thresholds above."""
    for n, tp in _splits(gpus, tps):
        for b in COLOCATED_BUDGETS:
            yield Layout(colocated=PoolShape(n, tp, b))
    for p_gpus in range(1, gpus):
        for d_gpus in range(1, gpus - p_gpus + 1):
            rest = gpus - p_gpus - d_gpus
            rests: list[PoolShape | None] = (
                [None]
                if rest == 0
                else [PoolShape(n, tp, b) for n, tp in _splits(rest, tps) for b in (8192,)]
            )
            for (pn, ptp), (dn, dtp) in ((p, d) for p in _splits(p_gpus, tps) for d in _splits(d_gpus, tps)):
                for pb in PREFILL_BUDGETS:
                    for db in DECODE_BUDGETS:
                        for colo in rests:
                            for thr in [None] if colo is None else THRESHOLDS:
                                yield Layout(colo, PoolShape(pn, ptp, pb), PoolShape(dn, dtp, db), thr)


def _link_load(layout: Layout, load: Load, hw: Hardware) -> float:
    """Share of the time each decode instance's KV link is busy (transfers spread round robin)."""
    assert layout.decode is not None
    share, prompt = (1.0, load.prompt_mean) if layout.threshold is None else load.long[layout.threshold]
    per_consumer = load.rate * share / layout.decode.instances
    return per_consumer * hw.link.transfer_time(int(prompt * hw.kv_bytes_per_token))


def _decode_batch_tokens(rate: float, prompt: float, output: float, tpot_s: float) -> float:
    """KV tokens a decode instance holds at once (Little's law): requests decoding at once, each with its
    prompt and half its output."""
    return rate * output * tpot_s * (prompt + output / 2)


def _cache_reason(layout: Layout, load: Load, hw: Hardware) -> str | None:
    """Why a pool that decodes cannot hold its decode batch in its KV cache, or None."""
    pools: list[tuple[str, PoolShape, float, float]] = []
    if layout.decode is not None:
        share, prompt = (1.0, load.prompt_mean) if layout.threshold is None else load.long[layout.threshold]
        pools.append(("decode", layout.decode, load.rate * share, prompt))
    if layout.colocated is not None:
        share, prompt = (0.0, 0.0) if layout.threshold is None else load.long[layout.threshold]
        rest = load.rate * (1 - share)
        rest_prompt = (load.prompt_mean - share * prompt) / (1 - share) if share < 1 else 0.0
        pools.append(("colocated", layout.colocated, rest, rest_prompt))
    for role, pool, rate, prompt in pools:
        need = _decode_batch_tokens(rate / pool.instances, prompt, load.output_mean, load.tpot_s)
        have = hw.kv_tokens(pool.tp)
        if need > have:
            return (
                f"KV cache cannot hold the decode batch: a {role} instance holds ~{need:,.0f} tokens at the "
                f"SLO's TPOT > its {have:,} KV tokens"
            )
    return None


def _same_routing(layout: Layout, load: Load) -> str | None:
    """A threshold that sends exactly the requests a smaller one sends (no prompt between them)."""
    thr = layout.threshold
    if thr is None:
        return None
    for lower in sorted(t for t in load.long if t < thr and t in THRESHOLDS):  # a fleet's own: not a grid's
        if load.long[lower] == load.long[thr]:
            return (
                f"routes the same requests as long>={lower} "
                f"(no prompt has {lower}-{thr - 1} effective tokens)"
            )
    return None


def prune(layout: Layout, load: Load, hw: Hardware, grid: bool = True) -> str | None:
    """Why this layout is cut before simulating (model fit, KV link, KV cache, a threshold that changes
    nothing), or None to simulate it. Not `grid` (the fleet's own layout): its pools may be in no other
    layout, so no smaller threshold of the same pools stands for it."""
    same = _same_routing(layout, load) if grid else None
    if same is not None:
        return same
    for pool in (layout.colocated, layout.prefill, layout.decode):
        if pool is not None and (why := fits(hw, pool.tp)):
            return why
    if layout.decode is not None:
        busy = _link_load(layout, load, hw)
        if busy >= 1.0:
            return (
                f"KV link cannot carry the transfer rate: each decode instance's {hw.link.name} link "
                f"would be busy {100 * busy:.0f}% of the time"
            )
    return _cache_reason(layout, load, hw)


def twins(a: Layout, b: Layout, load: Load) -> bool:
    """Hybrids of the same pools whose thresholds route the same requests of this traffic."""
    same_pools = (a.colocated, a.prefill, a.decode) == (b.colocated, b.prefill, b.decode)
    ta, tb = a.threshold, b.threshold
    if not same_pools or ta is None or tb is None or ta not in load.long or tb not in load.long:
        return False
    return load.long[ta] == load.long[tb]


def search_space(
    gpus: int, load: Load, hw: Hardware, tps: Sequence[int] = TP_SIZES, fleet: Sequence[Layout] = ()
) -> tuple[list[Layout], list[Pruned]]:
    """The layouts to simulate and those cut (each with its reason), in enumeration order; `tps` are the
    TP sizes a host can hold (tensor parallelism stays inside a host). `fleet`: the fleet's own layouts
    (its pools, its whole hybrid), added after the grid's when they have `gpus` GPUs and are not among
    them (a budget, TP or threshold outside the lists above; `load.long` must hold its threshold), unless
    a kept twin routes the same requests; cut by the same rules, the reason saying whose it is."""
    keep: list[Layout] = []
    cut: list[Pruned] = []
    for layout in candidates(gpus, tps):
        why = prune(layout, load, hw)
        if why is None:
            keep.append(layout)
        else:
            cut.append(Pruned(layout, why))
    seen = set(keep) | {c.layout for c in cut}
    for layout in fleet:
        if layout.gpus != gpus or layout in seen or any(twins(layout, k, load) for k in keep):
            continue
        seen.add(layout)
        why = prune(layout, load, hw, grid=False)
        if why is None:
            keep.append(layout)
        else:
            cut.append(Pruned(layout, f"the fleet's own layout: {why}"))
    return keep, cut

"""Timing models: how long one engine step (a batch of prefill chunks and decodes) takes on a GPU, and
when a KV transfer queued on a consumer's link completes.

T_step = t0 + max(compute, memory) + TP all-reduce time, per [PERF §2.6]:
- compute = (tokens · 2·P_linear + sampled · 2·P_lm_head + attention) / (tp · peak · MFU), where a request
  adding n tokens after ctx cached ones costs 4·L·d·(n·ctx + n²/2) attention FLOPs;
- memory  = (weights read per step + KV read of every scheduled request's context) / tp / (HBM BW · η).
KV transfers on one link run one after another, each taking setup + bytes / (η · bandwidth)
(`LinkSpec.transfer_time`). All times are simulated seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pdfleet.model.catalog import TP_ALLREDUCE_S, GpuRoofline, LinkSpec, ModelShape


@dataclass(frozen=True)
class PerfModel:
    """Precomputed per-token constants so a step costs a handful of float operations."""

    gpu: GpuRoofline
    model: ModelShape
    tp: int
    kv_bytes_per_token: int  # whole model (all TP ranks)
    # (FLOPs per token, per sampled token, per attention unit; bytes read per step; 1/FLOP/s; 1/byte/s;
    # fixed per step): the model's properties computed once, not on each of a run's ~10^5 steps
    _k: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        m = self.model
        comm = 2 * m.layers * TP_ALLREDUCE_S if self.tp > 1 else 0.0
        consts = (
            2.0 * m.linear_params,
            2.0 * m.embedding_params,
            4.0 * m.layers * m.heads * m.head_dim,
            float(m.step_read_bytes),
            1.0 / self._flops_rate,
            1.0 / self._bytes_rate,
            self.gpu.step_overhead_s + comm,
        )
        object.__setattr__(self, "_k", consts)  # frozen: set once here

    @property
    def _flops_rate(self) -> float:
        return self.tp * self.gpu.peak_flops * self.gpu.mfu

    @property
    def _bytes_rate(self) -> float:
        return self.tp * self.gpu.hbm_bandwidth * self.gpu.mem_efficiency

    def step_time(self, tokens: int, attn_units: float, kv_tokens: int, sampled: int) -> float:
        """Seconds for a step computing `tokens` new tokens.

        attn_units = Σ n·ctx + n²/2 over scheduled requests; kv_tokens = Σ (ctx + n) KV entries read;
        sampled = requests that produce an output token this step (each runs lm_head once).
        """
        per_token, per_sample, per_attn, weights, inv_flops, inv_bytes, fixed = self._k
        compute = (tokens * per_token + sampled * per_sample + attn_units * per_attn) * inv_flops
        memory = (weights + kv_tokens * self.kv_bytes_per_token) * inv_bytes
        return fixed + max(compute, memory)

    def prefill_only_time(self, n: int, ctx: int = 0) -> float:
        """One step that prefills n tokens of a single request after ctx cached ones (and samples)."""
        return self.step_time(n, n * ctx + n * n / 2.0, ctx + n, 1)

    def decode_time(self, batch: int, ctx: int) -> float:
        """One decode-only step of `batch` requests, each with `ctx` tokens of context."""
        return self.step_time(batch, batch * ctx + batch / 2.0, batch * (ctx + 1), batch)


@dataclass
class LinkQueue:
    """A consumer's KV link: transfers run one after another (FIFO), each taking setup + bytes/(η·BW)."""

    link: LinkSpec
    free_at: float = 0.0  # simulated time the link finishes its last queued transfer

    def reserve(self, now: float, nbytes: int) -> float:
        """Queue a transfer of nbytes asked for at `now`; returns when it completes."""
        self.free_at = max(now, self.free_at) + self.link.transfer_time(nbytes)
        return self.free_at

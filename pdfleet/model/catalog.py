"""Hardware, model and link catalogs for the simulator; every constant names its source.

Source keys (full citations in /work/shared/reference/perf-and-simulation.md, "§" = section there):
- [PERF §2.6]   the reference's analytic model and calibration anchors (t0, η, MFU ranges, step tables).
- [KLOCKWOOD]   glennklockwood.com A100/H100 pages, quoted in [PERF §2.6] (peak FLOPS, HBM bandwidth,
                links).
- [BLIS]        inference-sim hardware_config.json, quoted in [PERF §2.3] (L40S 362 TFLOPS, 0.864 TB/s,
                MFU 0.32).
- [NV-H200]     NVIDIA H200 datasheet: 141 GB HBM3e, 4.8 TB/s, same Hopper tensor cores as H100 SXM
                (989 TF BF16).
- [NV-L40S]     NVIDIA L40S datasheet: 48 GB GDDR6.
- [HF-LLAMA]    meta-llama/Llama-3.1-{8B,70B} and Llama-3.2-1B config.json (layers, hidden size, KV heads,
                FFN, vocab, tie_word_embeddings), cross-checked against [PERF §2.6]: 8B has 8.03 B params and
                128 KiB KV/token, 70B ~320 KiB/token; 3.2-1B: 1.24 B params (tied), 32 KiB KV/token.
- [MOONCAKE]    Mooncake vLLM P/D measurements, quoted in [PERF §1.3]: t_xfer ≈ 0.5 ms + bytes/(0.71·nominal).
- [LLMD-SETUP]  llm-d-inference-sim latency-profiles.md, quoted in [PERF §2.6]: per-transfer setup NVLink/shm
                0.1–0.5 ms, RDMA 0.5–2 ms, TCP 2–10 ms.
- [VLLM-CVD]    vLLM benchmarks/disagg_benchmarks chunk_vs_disagg.yaml, quoted in [PERF §1.6]: Llama-3.1-70B
                TP4 on H100, disaggregated ITL 21.3 ms at QPS 2 (batch ≈ 1).
"""

from __future__ import annotations

from dataclasses import dataclass

from pdfleet.errors import ValidationError

GIB = 1024**3


@dataclass(frozen=True)
class GpuRoofline:
    """One GPU's roofline: peak dense BF16 FLOPS, HBM bandwidth and memory, with achieved fractions."""

    name: str
    peak_flops: float  # dense BF16 FLOP/s
    hbm_bandwidth: float  # bytes/s
    memory_bytes: int
    mfu: float  # achieved fraction of peak FLOPS in the compute-bound regime
    mem_efficiency: float  # η: achieved fraction of HBM bandwidth when memory-bound
    step_overhead_s: float  # t0: CPU scheduling + kernel launch per engine step (CUDA graphs on)
    sources: str


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer's shape; parameter and KV sizes are derived from it."""

    name: str
    ids: tuple[str, ...]  # Hugging Face ids that select this entry (matched on the last path part)
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    max_model_len: int
    dtype_bytes: int  # bf16 weights and KV ("auto" kv-cache dtype)
    sources: str
    tied_embeddings: bool = False  # lm_head is the input embedding (config.json tie_word_embeddings)

    @property
    def linear_params(self) -> int:
        """Parameters of the per-layer matmuls (QKV, O, gate/up/down), all layers."""
        q = self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        mlp = 3 * self.hidden * self.ffn
        return self.layers * (q + kv + o + mlp)

    @property
    def embedding_params(self) -> int:
        """Input embedding (and, untied, the same again for lm_head)."""
        return self.vocab * self.hidden

    @property
    def total_params(self) -> int:
        """All parameters (embeddings once when tied, else twice; norms ignored: < 0.01%)."""
        return self.linear_params + (1 if self.tied_embeddings else 2) * self.embedding_params

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights held in GPU memory (all of them)."""
        return self.total_params * self.dtype_bytes

    @property
    def step_read_bytes(self) -> int:
        """Weight bytes read by one forward step: linear layers + lm_head (the embedding is a gather)."""
        return (self.linear_params + self.embedding_params) * self.dtype_bytes

    def kv_bytes_per_token(self, kv_dtype_bytes: int | None = None) -> int:
        """K and V for every layer: 2 × layers × kv_heads × head_dim × element size."""
        elem = self.dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes
        return 2 * self.layers * self.kv_heads * self.head_dim * elem


@dataclass(frozen=True)
class LinkSpec:
    """The path KV blocks take from a prefill to a decode GPU: t = setup + bytes / (η · bandwidth)."""

    name: str
    bandwidth: float  # nominal bytes/s, one direction
    efficiency: float  # η: achieved fraction for large transfers
    setup_s: float  # fixed per-transfer cost (handshake, descriptor posting)
    sources: str

    def transfer_time(self, nbytes: int) -> float:
        """Seconds to move nbytes over this link, fixed setup included."""
        return self.setup_s + nbytes / (self.efficiency * self.bandwidth)


# t0 = 0.5 ms and η = 0.75 reproduce the measured H100 batch-1 TPOT (6.48 ms) and the A100 table [PERF §2.6];
# MFU 0.5 sits inside the reference's 0.45–0.6 range and puts H100 4k prefill at ~33k tok/s (range 30–39k).
_T0 = 0.5e-3
_ETA = 0.75
_MFU = 0.5

GPUS: dict[str, GpuRoofline] = {
    g.name: g
    for g in (
        GpuRoofline(
            "H100-SXM",
            989e12,
            3.35e12,
            80 * GIB,
            _MFU,
            _ETA,
            _T0,
            "[KLOCKWOOD] 989 TF BF16, 3.35 TB/s, 80 GB; MFU/η/t0 [PERF §2.6]",
        ),
        GpuRoofline(
            "H200",
            989e12,
            4.8e12,
            141 * 10**9,
            _MFU,
            _ETA,
            _T0,
            "[NV-H200] 989 TF BF16, 4.8 TB/s, 141 GB; MFU/η/t0 as H100 [PERF §2.6]",
        ),
        GpuRoofline(
            "A100-80GB",
            312e12,
            2.039e12,
            80 * GIB,
            _MFU,
            _ETA,
            _T0,
            "[KLOCKWOOD] 312 TF BF16, 2.039 TB/s, 80 GB; MFU/η/t0 [PERF §2.6] (A100 b=1 10.4 ms)",
        ),
        GpuRoofline(
            "L40S",
            362e12,
            0.864e12,
            48 * 10**9,
            0.32,
            _ETA,
            _T0,
            "[BLIS] 362 TF, 0.864 TB/s, calibrated MFU 0.32; [NV-L40S] 48 GB; η/t0 [PERF §2.6]",
        ),
    )
}

MODELS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        ModelShape(
            "Llama-3.1-8B",
            (
                "meta-llama/Llama-3.1-8B-Instruct",
                "meta-llama/Llama-3.1-8B",
                "meta-llama/Meta-Llama-3.1-8B-Instruct",
                "meta-llama/Meta-Llama-3.1-8B",
            ),
            layers=32,
            hidden=4096,
            heads=32,
            kv_heads=8,
            head_dim=128,
            ffn=14336,
            vocab=128256,
            max_model_len=131072,
            dtype_bytes=2,
            sources="[HF-LLAMA] config.json; [PERF §2.6] 8.03 B params, 128 KiB KV/token",
        ),
        ModelShape(
            "Llama-3.1-70B",
            (
                "meta-llama/Llama-3.1-70B-Instruct",
                "meta-llama/Llama-3.1-70B",
                "meta-llama/Meta-Llama-3.1-70B-Instruct",
                "meta-llama/Meta-Llama-3.1-70B",
            ),
            layers=80,
            hidden=8192,
            heads=64,
            kv_heads=8,
            head_dim=128,
            ffn=28672,
            vocab=128256,
            max_model_len=131072,
            dtype_bytes=2,
            sources="[HF-LLAMA] config.json; [PERF §2.6] ~320 KiB KV/token",
        ),
        ModelShape(
            "Llama-3.2-1B",
            ("meta-llama/Llama-3.2-1B-Instruct", "meta-llama/Llama-3.2-1B"),
            layers=16,
            hidden=2048,
            heads=32,
            kv_heads=8,
            head_dim=64,
            ffn=8192,
            vocab=128256,
            max_model_len=131072,
            dtype_bytes=2,
            sources="[HF-LLAMA] config.json (tie_word_embeddings: true); 1.24 B params, 32 KiB KV/token",
            tied_embeddings=True,
        ),
    )
}

LINKS: dict[str, LinkSpec] = {
    lk.name: lk
    for lk in (
        LinkSpec(
            "pcie-gen4",
            32e9,
            0.78,
            0.3e-3,
            "[KLOCKWOOD] 32 GB/s/dir; η 0.78 gives the reference's ~25 GB/s column [PERF §2.6]; "
            "setup [LLMD-SETUP] shm 0.1–0.5 ms",
        ),
        LinkSpec(
            "pcie-gen5",
            64e9,
            0.78,
            0.3e-3,
            "[KLOCKWOOD] 128 GB/s bidirectional; η 0.78 gives ~50 GB/s [PERF §2.6]; setup [LLMD-SETUP]",
        ),
        LinkSpec(
            "nvlink",
            450e9,
            0.82,
            0.3e-3,
            "[KLOCKWOOD] H100 NVLink4 900 GB/s bidirectional; η 0.82 gives ~370 GB/s/dir [PERF §2.6]; "
            "setup [LLMD-SETUP] NVLink 0.1–0.5 ms",
        ),
        LinkSpec(
            "roce-100g",
            12.5e9,
            0.71,
            0.5e-3,
            "[KLOCKWOOD] 100 Gb/s = 12.5 GB/s; η 0.71 and 0.5 ms setup [MOONCAKE]",
        ),
        LinkSpec(
            "roce-200g",
            25e9,
            0.71,
            0.5e-3,
            "[KLOCKWOOD] 200 Gb/s = 25 GB/s; η 0.71 and 0.5 ms setup [MOONCAKE]",
        ),
        LinkSpec(
            "roce-400g",
            50e9,
            0.71,
            0.5e-3,
            "[KLOCKWOOD] 400 Gb/s = 50 GB/s; η 0.71 and 0.5 ms setup [MOONCAKE]",
        ),
        LinkSpec(
            "tcp",
            12.5e9,
            0.35,
            5e-3,
            "UCX over TCP on a 100 GbE NIC [KLOCKWOOD 12.5 GB/s]; setup 5 ms, middle of [LLMD-SETUP] "
            "TCP 2–10 ms; η 0.35 [unverified: no published NIXL-over-TCP throughput; half of RDMA's 0.71]",
        ),
    )
}

# Tensor parallelism: two all-reduces per layer per step. 0.0425 ms each makes Llama-3.1-70B TP4 on H100
# step at 21.3 ms at batch ≈ 1, the disaggregated ITL [VLLM-CVD] reports (roofline alone gives 14.5 ms).
TP_ALLREDUCE_S = 0.0425e-3

# Memory vLLM keeps outside weights and KV (activations of a max-size batch, CUDA graphs, allocator slack)
# [unverified estimate: vLLM profiles it at start-up; 2 GiB is typical for 8B-70B at 8192 batched tokens].
NON_KV_RESERVE_BYTES = 2 * GIB

# vLLM's default KV block size in tokens (--block-size default 16 on CUDA).
DEFAULT_BLOCK_SIZE = 16

# --kv-cache-dtype values the simulator can size, and their element size in bytes ("auto" = the model
# dtype). Which values a release takes is the facts table's (`--kv-cache-dtype` choices), not this list.
KV_CACHE_DTYPES: dict[str, int | None] = {
    "auto": None,
    "float16": 2,
    "bfloat16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
    "fp8_ds_mla": 1,
}


def gpu(name: str) -> GpuRoofline:
    """The GPU entry by its catalog name, or a ValidationError listing the known ones."""
    if name not in GPUS:
        raise ValidationError(f"--sim-gpu {name!r}: unknown GPU; known: {', '.join(GPUS)}")
    return GPUS[name]


def link(name: str) -> LinkSpec:
    """The link entry by its catalog name, or a ValidationError listing the known ones."""
    if name not in LINKS:
        raise ValidationError(f"--sim-link {name!r}: unknown link; known: {', '.join(LINKS)}")
    return LINKS[name]


def model(model_id: str) -> ModelShape:
    """The model entry for a Hugging Face id or a local path whose last part names a known model."""
    wanted = model_id.rstrip("/").rsplit("/", 1)[-1].lower()
    for spec in MODELS.values():
        if any(i.rsplit("/", 1)[-1].lower() == wanted for i in spec.ids):
            return spec
    known = ", ".join(i for m in MODELS.values() for i in m.ids[:1])
    raise ValidationError(
        f"model {model_id!r}: not in the simulator's catalog (matched on its last path part); known: {known}"
    )

"""Shared pieces of the model tests: the repo's profiles and inventories, and a known-good base profile."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PROFILES = REPO / "profiles"
SHIPPED = ["colocated", "same-host-pcie", "cross-rdma"]

# A valid cross-host base (`extends: _good`) that each bad-profile case breaks in one way.
GOOD = """
topology: cross-host
model: {id: meta-llama/Llama-3.1-8B-Instruct, max_model_len: 32768}
vllm:
  version: "0.11.0"
  engine: vllm
  sim: {gpu: H100-SXM, link: roce-400g}
kv_transfer: {connector: NixlConnector, side_channel_port: 5600}
pools:
  prefill: {port: 8100, gpus: [0], max_num_batched_tokens: 8192, gpu_memory_utilization: 0.85}
  decode: {port: 8200, gpus: [0], max_num_batched_tokens: 2048, gpu_memory_utilization: 0.90}
gpu: {driver_branch: "580"}
rdma: {enabled: true}
gateway:
  tls: off
  stage: colocated
  stages:
    colocated: {short: 0, long: 0}
    long-prompts: {short: 0, long: 100}
slo: {ttft_p99_ms: 3000, tpot_p99_ms: 60, itl_p99_ms: 200, kv_transfer_p99_ms: 500}
"""

SAME_HOST = "extends: _good\ntopology: same-host\npools: {decode: {gpus: [1]}}\n"


def write(tmp_path: Path, text: str, name: str = "inv.yml") -> Path:
    """A file with this text in tmp_path."""
    path = tmp_path / name
    path.write_text(text)
    return path

"""Shared pieces of the model tests: the repo's profiles and inventories, a known-good base profile, and
the source files of the cached vLLM wheels."""

from __future__ import annotations

import ast
import sys
import types
import zipfile
from pathlib import Path
from typing import Any, Optional, Union

import msgspec
import pytest

from pdfleet.model.vllm_kv_events import SOURCE

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


WHEELS = Path("~/.cache/pdfleet/vllm-wheels").expanduser()  # where `python -m tools.vllm_facts` keeps them


def wheel_source(version: str, path: str) -> str:
    """A source file of the release's cached wheel (skipped when the wheel is not cached)."""
    wheels = sorted(WHEELS.glob(f"vllm-{version}-*.whl"))
    if not wheels:
        pytest.skip(f"vLLM {version}'s wheel is not in {WHEELS} (python -m tools.vllm_facts downloads it)")
    with zipfile.ZipFile(wheels[-1]) as archive:
        return archive.read(path).decode()


CLASSES = ("EventBatch", "KVCacheEvent", "BlockStored", "BlockRemoved", "AllBlocksCleared", "KVEventBatch")


def wheel_events(version: str) -> dict[str, Any]:
    """The release's event classes, compiled from its wheel's source with msgspec (nothing else of vLLM)."""
    tree = ast.parse(wheel_source(version, SOURCE))
    body: list[ast.stmt] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in CLASSES]
    name = f"vllm_{version.replace('.', '_')}_kv_events"
    module = sys.modules.get(name)
    if module is None:  # a module of its own: msgspec resolves the classes' annotations in its globals
        module = types.ModuleType(name)
        module.__dict__.update(msgspec=msgspec, Any=Any, Optional=Optional, Union=Union)
        module.__dict__["ExternalBlockHash"] = bytes | int
        exec(compile(ast.Module(body, []), SOURCE, "exec"), module.__dict__)  # noqa: S102 - vLLM's own classes
        sys.modules[name] = module
    return module.__dict__

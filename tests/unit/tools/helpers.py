"""Shared pieces of the tools tests: vLLM source excerpts kept as fixtures, read like a wheel."""

from __future__ import annotations

from pathlib import Path

from tools import vllm_extract as ex
from tools.vllm_ast import Sources

FIXTURES = Path(__file__).resolve().parent / "fixtures"
NIXL_011 = "vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py"
NIXL_033 = "vllm/distributed/kv_transfer/kv_connector/v1/nixl"
MOONCAKE_033 = "vllm/distributed/kv_transfer/kv_connector/v1/mooncake"


def sources(version: str) -> Sources:
    """The excerpts of one release, keyed by their path inside the wheel."""
    return Sources.from_dir(FIXTURES / f"vllm-{version}", version)


def nixl_files(src: Sources) -> list[str]:
    """NixlConnector's files in the excerpts, found from the factory registration as in a wheel."""
    return ex.connector_files(src, ex.registry(src), ex.NIXL)


def mooncake_files(src: Sources) -> list[str]:
    """MooncakeConnector's files in the excerpts (none before 0.13)."""
    return ex.connector_files(src, ex.registry(src), ex.MOONCAKE)

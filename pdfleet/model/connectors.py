"""vLLM KV connector names, and "did you mean" suggestions for wrong ones.

Which names a release registers is the facts table's registry row (`vllm_release_data`, from
`vllm/distributed/kv_transfer/kv_connector/factory.py` of that wheel); this module holds the names
pdfleet renders and every name some release registered, for suggestions.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from pdfleet.model.vllm_releases import Release

Version = tuple[int, int, int]

_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:(?:rc|a|b)\d+|\.post\d+|\.dev\d+)?$")

# The oldest vLLM whose connector registry we know (factory @007c643, ~v0.10.2).
MIN_VLLM: Version = (0, 10, 0)

# Connectors pdfleet can render P/D units for; which release registers each is the facts table's
# registry row (`vllm_releases.Release.has_connector`).
SUPPORTED: tuple[str, ...] = ("NixlConnector", "MooncakeConnector")

# Every name that is a registered vLLM connector in some version (2026 main plus removed/renamed ones).
ALL_KNOWN: frozenset[str] = frozenset(
    {
        "SharedStorageConnector",
        "P2pNcclConnector",
        "LMCacheConnectorV1",
        "LMCacheMPConnector",
        "NixlConnector",
        "NixlPullConnector",
        "NixlPushConnector",
        "MultiConnector",
        "MoRIIOConnector",
        "OffloadingConnector",
        "DecodeBenchConnector",
        "ExampleConnector",
        "ExampleHiddenStatesConnector",
        "MooncakeConnector",
        "MooncakeStoreConnector",
        "FlexKVConnectorV1",
        "SimpleCPUOffloadConnector",
        "HF3FSKVConnector",
        "HiSparseConnector",  # 0.33
    }
)

# Names people write that are not connectors, mapped to the connector they usually mean.
_ALIASES: dict[str, str] = {
    "mooncaketransferengine": "MooncakeConnector",  # a Mooncake class name, not a kv_connector (§1.2)
    "mooncake": "MooncakeConnector",
    "mooncakeconnectorv1": "MooncakeConnector",  # vllm-ascend's out-of-tree NPU connector
    "nixl": "NixlConnector",
    "nixlv2": "NixlConnector",  # llm-d sidecar's spelling
    "lmcacheconnector": "LMCacheConnectorV1",
}

# The connectors pdfleet renders (others are validated but not deployed).
NIXL = "NixlConnector"
MOONCAKE = "MooncakeConnector"

# vLLM's default for VLLM_NIXL_SIDE_CHANNEL_PORT [VLLM-PD §2.1].
NIXL_SIDE_CHANNEL_PORT = 5600


@dataclass(frozen=True)
class ConnectorProblem:
    """Why a connector name cannot be used with a pinned vLLM version."""

    message: str


def parse_version(text: str) -> Version | None:
    """`0.11.0` (optionally rcN/.postN/.devN) as a tuple, or None if it is not an exact X.Y.Z pin."""
    match = _VERSION.match(text.strip())
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def fmt(version: Version) -> str:
    """A version tuple as X.Y.Z."""
    return ".".join(str(part) for part in version)


def suggest(name: str) -> str | None:
    """The real connector a misspelt or invented name most likely means."""
    alias = _ALIASES.get(name.lower().replace("_", "").replace("-", ""))
    if alias:
        return alias
    by_lower = {known.lower(): known for known in ALL_KNOWN}
    if name.lower() in by_lower:
        return by_lower[name.lower()]
    close = difflib.get_close_matches(name, sorted(ALL_KNOWN), n=1, cutoff=0.6)
    return close[0] if close else None


def check_connector(name: str, rel: Release) -> ConnectorProblem | None:
    """None if pdfleet can render `name` for that vLLM release, else what is wrong and what to use."""
    supported = ", ".join(SUPPORTED)
    if name not in ALL_KNOWN and not rel.has_connector(name):
        hint = suggest(name)
        tail = f"; did you mean {hint}?" if hint else f"; pdfleet renders {supported}"
        return ConnectorProblem(f"{name!r} is not a vLLM connector{tail}")
    if name not in SUPPORTED:
        return ConnectorProblem(
            f"{name} is a vLLM connector but not one pdfleet renders P/D units for; use one of {supported}"
        )
    if not rel.has_connector(name):
        others = [other for other in SUPPORTED if other != name and rel.has_connector(other)]
        return ConnectorProblem(
            f"{name} is not registered in vLLM {rel.version} "
            f"(vllm/distributed/kv_transfer/kv_connector/factory.py); pin a release that has it "
            f"or use {', '.join(others) or 'another connector'}"
        )
    return None

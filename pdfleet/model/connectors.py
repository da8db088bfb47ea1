"""vLLM KV connector names per pinned vLLM version, and "did you mean" suggestions for wrong ones.

Facts come from /work/shared/reference/vllm-pd.md §1.1-1.3 (the registered names in
`vllm/distributed/kv_transfer/kv_connector/factory.py`). Where the exact first release of a name is not
verified we use the first release it is *verified* in, so we never claim a name exists where it may not;
the cost is that a pin in an unverified window is refused with a message saying which pin works.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

Version = tuple[int, int, int]

_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:(?:rc|a|b)\d+|\.post\d+|\.dev\d+)?$")

# The oldest vLLM whose connector registry we know (factory @007c643, ~v0.10.2).
MIN_VLLM: Version = (0, 10, 0)

# Connectors pdfleet can render P/D units for, with the first vLLM release each is verified in.
# MooncakeConnector (PR #24718, late 2025) is absent from the v0.11 factory and documented in v0.15.0.
SUPPORTED: dict[str, Version] = {
    "NixlConnector": (0, 10, 0),
    "MooncakeConnector": (0, 15, 0),
}

# Registered names by era: (first release of the era, names registered then).
_ERAS: tuple[tuple[Version, frozenset[str]], ...] = (
    (
        (0, 10, 0),
        frozenset(
            {
                "SharedStorageConnector",
                "P2pNcclConnector",
                "LMCacheConnectorV1",
                "NixlConnector",
                "MultiConnector",
            }
        ),
    ),
    (
        (0, 11, 0),
        frozenset(
            {
                "SharedStorageConnector",
                "P2pNcclConnector",
                "LMCacheConnectorV1",
                "NixlConnector",
                "MultiConnector",
                "LMCacheMPConnector",
                "OffloadingConnector",
                "DecodeBenchConnector",
            }
        ),
    ),
)

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

# vLLM's defaults for VLLM_NIXL_SIDE_CHANNEL_HOST / VLLM_NIXL_SIDE_CHANNEL_PORT [VLLM-PD §2.1].
# The connectors pdfleet renders (others are validated but not deployed).
NIXL = "NixlConnector"
MOONCAKE = "MooncakeConnector"

NIXL_SIDE_CHANNEL_HOST = "localhost"
NIXL_SIDE_CHANNEL_PORT = 5600

# kv_load_failure_policy arrived in PR #26813 (Oct 2025), after v0.11.0 was cut.
LOAD_FAILURE_POLICY_ABSENT_UNTIL: Version = (0, 11, 0)


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


def registered(version: Version) -> frozenset[str] | None:
    """Connector names registered in that vLLM release where verified (0.10.x, 0.11.x), else None.

    Newer registries are only partly verified, so for them pdfleet relies on SUPPORTED alone.
    """
    if version < MIN_VLLM or version >= (0, 12, 0):
        return None
    return [names for first, names in _ERAS if first <= version][-1]


def check_connector(name: str, version: Version) -> ConnectorProblem | None:
    """None if pdfleet can render `name` for that vLLM version, else what is wrong and what to use."""
    supported = ", ".join(SUPPORTED)
    if name not in ALL_KNOWN:
        hint = suggest(name)
        tail = f"; did you mean {hint}?" if hint else f"; pdfleet renders {supported}"
        return ConnectorProblem(f"{name!r} is not a vLLM connector{tail}")
    if name not in SUPPORTED:
        return ConnectorProblem(
            f"{name} is a vLLM connector but not one pdfleet renders P/D units for; use one of {supported}"
        )
    first = SUPPORTED[name]
    if version < first:
        return ConnectorProblem(
            f"{name} is not in vLLM {fmt(version)} (pdfleet knows it from vLLM {fmt(first)}); "
            f"pin vllm.version >= {fmt(first)} or use "
            + ", ".join(other for other, since in SUPPORTED.items() if since <= version and other != name)
        )
    return None

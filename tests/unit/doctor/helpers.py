"""Fixture loading and a lab-cross deployment for the fleet rule tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pdfleet.fleet.deployment import Deployment
from tests.unit.fleet.helpers import deploy

REPO = Path(__file__).resolve().parents[3]
FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name: str) -> dict[str, Any]:
    """One fixture file (every entry carries its `source`)."""
    data = yaml.safe_load((FIXTURES / name).read_text())
    assert all("source" in entry for entry in data.values()), name
    return data


def deployment(profile: str, inventory: str = "inventory/lab.yml") -> Deployment:
    """A real profile and inventory of the repo, loaded as the tasks load them."""
    return deploy(profile, REPO / inventory, secrets=None)


VLLM_LOCAL_KEY = "sk-vllm-local-0123456789"


@dataclass(frozen=True)
class ClientFleet:
    """Where the doctor's probes go: the gateway's base URLs and two pool instances."""

    gateway_port: int
    pool_url: str  # a simulator without a key: what a pool port answers
    guarded_url: str  # a simulator started with --api-key

    @property
    def openai_base(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}/v1"

    @property
    def anthropic_base(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

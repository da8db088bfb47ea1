"""Roles: one concern each (pdfleet.fleet.roles describes the contract), listed here in the order they run.

Drivers and NICs come before the KV libraries, the venv and the staged weights before the units using
them, the pools before the gateway in front of them, every host's node exporter, monitoring (it scrapes
them all, Alertmanager beside it), and the rollout controller last (it reads Prometheus and drives the
gateways).
"""

from __future__ import annotations

from pdfleet.fleet.roles import Role
from roles import (
    base,
    gateway,
    gpu_driver,
    kv_transfer,
    monitoring,
    node_exporter,
    rdma,
    rollout,
    services,
    vllm,
    weights,
)

REGISTRY: tuple[Role, ...] = (
    base,
    gpu_driver,
    rdma,
    kv_transfer,
    vllm,
    weights,
    services,
    gateway,
    node_exporter,
    monitoring,
    rollout,
)

"""Provisioning: the per-host plan (roles → operations) that the runner applies, and its offline render;
and the live-stage rule: provision never moves traffic by itself.

The profile's `gateway.stage` is only the initial stage. On a gateway host that already runs a policy,
provision keeps that policy's stage (the rollout controller's, a step's weights included) unless
`invoke provision --stage S` says otherwise, and bumps the version only when the policy's meaning
changes, so a converged gateway reloads nothing and the controller sees no foreign version.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from pdfleet.errors import ValidationError
from pdfleet.fleet.deployment import Deployment
from pdfleet.fleet.render import RenderedFile
from pdfleet.fleet.roles import role_files
from pdfleet.hw.gpu_facts import DriverFact, KernelFact, NvidiaPciFact, SecureBootFact
from pdfleet.hw.rdma_facts import RdmaSysfsFact
from pdfleet.model.inventory import Host
from pdfleet.model.profile import Profile
from pdfleet.model.stages import StageSpec
from pdfleet.model.yamlfile import parse_yaml
from pdfleet.ops.apt import AptPackages
from pdfleet.ops.base import Fact, FactSource, Operation, Skip
from pdfleet.ops.kernel import LoadedModules
from pdfleet.ops.report import console_progress
from pdfleet.ops.runner import Report, RunOptions, run_fleet

# What roles read about every host before they yield operations (base: installed packages).
HOST_FACTS: tuple[Fact[Any], ...] = (AptPackages(),)
# What the hardware roles read on hosts running vLLM (gpu_driver, rdma, kv_transfer detect first).
POOL_HOST_FACTS: tuple[Fact[Any], ...] = (
    SecureBootFact(),
    NvidiaPciFact(),
    DriverFact(),
    KernelFact(),
    LoadedModules(),
    RdmaSysfsFact(),
)


def plan_host(deployment: Deployment, host: Host, facts: FactSource) -> Iterator[Operation | Skip]:
    """The ordered operations of every role that applies to this host."""
    ctx = deployment.context(host)
    for role in deployment.roles:
        if role.applies(ctx):
            yield from role.operations(ctx, facts)


def host_facts(deployment: Deployment, host: Host) -> tuple[Fact[Any], ...]:
    """The facts worth gathering in a host's first batch: those its roles read before any operation.
    A fact missing here still works (gathered when read), at the cost of one more round trip."""
    pool = bool(deployment.topology.on_host(host.name))
    return HOST_FACTS + (POOL_HOST_FACTS if pool else ())


def render_fleet(deployment: Deployment, hosts: Iterable[Host]) -> dict[str, list[RenderedFile]]:
    """Every fact-independent file provision would install, per host."""
    return {host.name: role_files(deployment.roles, deployment.context(host)) for host in hosts}


def provision(deployment: Deployment, hosts: Sequence[Host], options: RunOptions, console: Console) -> Report:
    """Plan and (unless options.check) apply every host, showing per-host progress on `console`."""
    planner = functools.partial(plan_host, deployment)
    prefetch = functools.partial(host_facts, deployment)
    return run_fleet(hosts, planner, options, progress=console_progress(console), prefetch=prefetch)


@dataclass(frozen=True)
class LivePolicy:
    """What a gateway host's policy file says now: version, stage, stages, and its meaning (the parsed
    file without its version) to compare a rendered policy with."""

    version: int
    stage: str
    stages: dict[str, StageSpec]
    meaning: dict[str, Any]


def live_policy(text: str | None) -> LivePolicy | None:
    """The policy a host runs, from its file's text (None: no file, or not a policy pdfleet wrote)."""
    if text is None:
        return None
    try:
        data = parse_yaml(text, Path("policy.yaml"))
        stages = {str(k): StageSpec.model_validate(v) for k, v in data["stages"].items()}
        version, stage = int(data["version"]), str(data["stage"])
    except (ValidationError, KeyError, TypeError, ValueError, AttributeError):
        return None
    if stage not in stages:
        return None
    return LivePolicy(version, stage, stages, {k: v for k, v in data.items() if k != "version"})


def policy_stage(
    profile: Profile, live: LivePolicy | None, override: str | None
) -> tuple[str, dict[str, StageSpec]]:
    """The stage to render and the stages beside it: the override, else the live one (a rollout step's
    weights kept), else the profile's initial stage."""
    stages = dict(profile.gateway.stages)
    if override is not None:
        return override, stages
    if live is None:
        return profile.gateway.stage, stages
    if live.stage not in stages:
        stages[live.stage] = live.stages[live.stage]
    return live.stage, stages


def policy_version(profile: Profile, live: LivePolicy | None, render: Callable[[int], str]) -> int:
    """The version to render: the live one when the policy means the same, else one above it."""
    if live is None:
        return profile.gateway.policy_version
    same = live_policy(render(live.version))
    if same is not None and same.meaning == live.meaning:
        return live.version
    return max(live.version + 1, profile.gateway.policy_version)

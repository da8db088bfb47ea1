"""`invoke bench --pools routed [--stage S]`: what the gateway routes the run by, and a stage for the run.

The routed run sends no pool header, so the gateway's live stage and threshold decide each request's pool.
What they are is read from every gateway's `GET /admin/policy` (the profile's admin key) and kept in
results.json's `routing`. With a stage (`--stage S`, or `invoke plan --validate`'s weights), every gateway
runs it for the run, set through `POST /admin/stage` as the rollout controller sets one (a version above
the live one), and the previous stage is put back afterwards, also when the run fails or is interrupted:
unless something else changed the stage meanwhile (then it is left, and said). A profile serving several
models routes each by its model group's stage (`groups:` in the policy, the pdfleet model's name): the run
reads, sets and puts back the benched model's group only (`POST /admin/stage` with `model`), every other
model's stage left as it is. The decisions are pure (`group_view`, `routing_of`, `staging`); this wires the
admin client.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pdfleet.errors import ConnectError, ValidationError
from pdfleet.model.stages import StageSpec

if TYPE_CHECKING:
    from pdfleet.fleet.deployment import Deployment
    from pdfleet.rollout.config import GatewayTarget
    from pdfleet.rollout.gateways import GatewayClient

VALIDATE_STAGE = "plan-validate"  # the stage added for a run when the live policy has none of its weights


GROUP_KEYS = ("stage", "stage_percent_disagg", "stages", "long_prompt_tokens")  # a model group's own


def group_view(policy: Mapping[str, Any], group: str | None) -> dict[str, Any]:
    """The /admin/policy answer as one model group routes by it: its stage, weights, stages and threshold
    over the top level's (the version and decider are the policy's) and `group` set; None: the policy
    as it is. ValidationError naming the groups when the policy has none for it."""
    if group is None:
        return dict(policy)
    groups = policy.get("groups") or {}
    if group not in groups:
        raise ValidationError(
            f"the gateway's policy has no model group {group!r} (its groups: {', '.join(groups) or 'none'}): "
            "provision the profile first (invoke provision --profile P)"
        )
    return {**policy, **{k: groups[group][k] for k in GROUP_KEYS}, "group": group}


def routing_of(policy: Mapping[str, Any]) -> dict[str, Any]:
    """What a gateway routes by, from its /admin/policy answer (or a `group_view` of it): stage, its
    weights, threshold and on what, and the model group when it is one's."""
    return {
        "stage": policy["stage"],
        "stage_percent_disagg": dict(policy["stage_percent_disagg"]),
        "long_prompt_tokens": policy["long_prompt_tokens"],
        "threshold_on": (policy.get("decider") or {}).get("threshold_on", "prompt"),
        "version": policy["version"],
        **({"group": policy["group"]} if policy.get("group") else {}),
    }


def staging(
    policy: Mapping[str, Any], stage: str | None, weights: StageSpec | None = None
) -> tuple[str, dict[str, StageSpec]]:
    """The stage to run and the stages to send: `stage` when the live policy has it (ValidationError naming
    them when not); else the first live stage with `weights`, or VALIDATE_STAGE with them added."""
    stages = {k: StageSpec.model_validate(v) for k, v in policy["stages"].items()}
    if stage is not None:
        if stage not in stages:
            raise ValidationError(
                f"--stage {stage}: the gateway's policy has no such stage (its stages: {', '.join(stages)})"
            )
        return stage, stages
    if weights is None:
        raise ValidationError("a stage needs a name or its weights")
    if stages.get(policy["stage"]) == weights:  # the live stage already routes so
        return str(policy["stage"]), stages
    found = next((name for name, w in stages.items() if w == weights), None)
    if found is not None:
        return found, stages
    return VALIDATE_STAGE, {**stages, VALIDATE_STAGE: weights}


def _admin(deployment: Deployment) -> tuple[GatewayClient, list[GatewayTarget]]:
    """The admin client (the profile's admin key file) and every gateway's admin URL (the topology)."""
    from urllib.parse import urlparse

    from pdfleet.lab.network import lab_route_problem
    from pdfleet.rollout.config import GatewayTarget, read_admin_key
    from pdfleet.rollout.gateways import GatewayClient

    gateways = deployment.topology.gateways
    if not gateways:
        raise ValidationError("--pools routed: the inventory has no gateway host")
    problem = lab_route_problem([urlparse(g.admin_url).hostname or "" for g in gateways])
    if problem:
        raise ConnectError(problem)
    key = read_admin_key(Path(deployment.profile.gateway.admin_key_file).expanduser())
    targets = [GatewayTarget(name=g.host, admin_url=g.admin_url) for g in gateways]
    return GatewayClient(key, timeout_s=5.0, ca_file=gateways[0].ca_file), targets


@contextmanager
def routed(
    deployment: Deployment,
    stage: str | None,
    weights: StageSpec | None = None,
    note: Any = print,
    model: str | None = None,
) -> Iterator[dict[str, Any]]:
    """The routing the run goes by (results.json's `routing`); with `stage` or `weights`, that stage set on
    every gateway for the block and the previous one put back after it. A profile serving several models:
    the group of `model` (the benched model's name), read, set and put back alone."""
    group = model if len(deployment.profile.served) > 1 else None
    client, targets = _admin(deployment)
    with staged(client, targets, group, stage, weights, note) as routing:
        yield routing


@contextmanager
def staged(
    client: GatewayClient,
    targets: list[GatewayTarget],
    group: str | None,
    stage: str | None,
    weights: StageSpec | None = None,
    note: Any = print,
) -> Iterator[dict[str, Any]]:
    """`routed` on these gateways' admin APIs: the routing of the policy's top level or of model `group`,
    with a stage set for the block and put back after it when one is asked."""
    live = group_view(client.policy(targets[0]), group)
    if stage is None and weights is None:
        yield routing_of(live)
        return
    name, stages = staging(live, stage, weights)
    if name == live["stage"]:
        yield routing_of(live)
        return
    before = {t.name: group_view(client.policy(t), group) for t in targets}
    try:
        for t in targets:
            client.apply(t, int(before[t.name]["version"]) + 1, name, stages, model=group)
        yield {**routing_of(group_view(client.policy(targets[0]), group)), "set_from": live["stage"]}
    finally:
        for t in targets:
            _put_back(client, t, before[t.name], name, note, group)


def _put_back(
    client: GatewayClient,
    target: GatewayTarget,
    before: Mapping[str, Any],
    ours: str,
    note: Any,
    group: str | None = None,
) -> None:
    """The stage a gateway (or its model `group`) ran before the run, unless it no longer runs ours (then
    it is left, and said)."""
    now = group_view(client.policy(target), group)
    if now["stage"] != ours:
        whose = f"gateway {target.name}" + (f"'s model group {group}" if group else "")
        note(f"bench: {whose} runs stage {now['stage']} now, not {ours}: left as it is")
        return
    stages = {k: StageSpec.model_validate(v) for k, v in before["stages"].items()}
    client.apply(target, int(now["version"]) + 1, str(before["stage"]), stages, model=group)


def print_routes(doc: Mapping[str, Any], out: Any) -> None:
    """A routed run's routes per class (rich table on `out`) and what the gateway routed by."""
    from rich.table import Table

    from pdfleet.bench.routes import ROUTES, route_rows, routing_notes

    rows = route_rows(dict(doc))
    if not rows:
        return
    table = Table(title="routed: the routes the gateway took")
    for column in ROUTES:
        table.add_column(column, justify="left" if column in ROUTES[:2] else "right")
    for row in rows:
        table.add_row(*row)
    out.print(table)
    for line in routing_notes(dict(doc)):
        out.print(line, highlight=False)

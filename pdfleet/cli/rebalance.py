"""`invoke rebalance --host H --to POOL --dry-run`: the move of one host between the colocated, prefill and
decode pools as the pure mover plans it from the live layout (issue 35), or why it is refused.

This session ships the dry run only: it prints the steps, the layout after the move and the hosts a move
provisions, and changes nothing. The live move (drain through the gateway's policy and vllm-router's own
worker endpoints, the bounded wait, then provisioning) is refused with that reason until it is built.
"""

from __future__ import annotations

from invoke import Context, task

from pdfleet.cli.exits import user_errors
from pdfleet.cli.options import HELP, layout_note, open_deployment
from pdfleet.errors import ValidationError
from pdfleet.fleet.deployment import Deployment
from pdfleet.fleet.mover import DEFAULT_WAIT_S, Layout, MovePlan, layout_of, plan_move
from pdfleet.model.specs import POOL_NAMES


@task(
    positional=[],  # `invoke TASK --help` is help, not a profile named --help
    auto_shortflags=False,  # -h would read as --help
    help={
        "profile": HELP["profile"],
        "inventory": HELP["inventory"],
        "host": "The inventory host to move (it must serve exactly one pool of the profile's model).",
        "to": f"The pool it is to serve: one of {', '.join(POOL_NAMES)}.",
        "wait": f"Seconds the drained host's in-flight requests may run before the move goes on (default "
        f"{DEFAULT_WAIT_S:.0f}).",
        "dry_run": "Print the move's steps, the layout after it and the hosts it provisions; change "
        "nothing (required this session: the live move is not built yet).",
    },
)
@user_errors
def rebalance(
    ctx: Context,
    profile: str,
    host: str,
    to: str,
    inventory: str | None = None,
    wait: int = int(DEFAULT_WAIT_S),
    dry_run: bool = False,
) -> None:
    """Move a host between the colocated, prefill and decode pools (--dry-run: plan it, change nothing)."""
    if wait <= 0:
        raise ValidationError(f"--wait must be a positive number of seconds, not {wait}")
    deployment = open_deployment(ctx, profile, inventory)
    if deployment.profile.models:
        raise ValidationError(
            f"--profile {profile}: lists models; invoke rebalance moves the hosts of a single-model profile"
        )
    layout = layout_of(deployment.profile.served[0], deployment.inventory)
    print(layout_note(ctx, profile, inventory))
    out = plan_move(layout, host, to, wait)
    if not isinstance(out, MovePlan):
        raise ValidationError(f"--host {host} --to {to}: refused: {out.reason}")
    if not dry_run:
        raise ValidationError(
            f"--host {host} --to {to}: the mover accepts it, but the live move is not built yet (draining "
            "through vllm-router's /remove_worker and /add_worker and the gateway's policy, the bounded "
            "wait, provisioning the host): see its steps with --dry-run"
        )
    for line in describe(out, deployment):
        print(line)


def describe(plan: MovePlan, deployment: Deployment) -> list[str]:
    """The dry run's lines: the move, its steps, the layout after it and the hosts it provisions."""
    lines = [f"rebalance {plan.host}: {plan.source} -> {plan.target} (dry run: nothing changes)"]
    for n, step in enumerate(plan.steps, 1):
        bound = f" (at most {step.bound_s:.0f} s)" if step.bound_s is not None else ""
        lines.append(f"  {n}. {step.kind}: {step.detail}{bound}")
    lines.append("layout after the move:")
    lines.extend(f"  {pool}: {', '.join(hosts) or '(none)'}" for pool, hosts in _pools(plan.after).items())
    topo = deployment.topology
    others = [g.host for g in topo.gateways] + [p.host for p in topo.monitoring]
    provisioned = [plan.host, *dict.fromkeys(h for h in others if h != plan.host)]
    lines.append(
        f"provisions: {', '.join(provisioned)} (the host's units; gateway, router, Prometheus targets)"
    )
    return lines


def _pools(layout: Layout) -> dict[str, list[str]]:
    """Each pool the layout has and its hosts, in prefill, decode, colocated order."""
    return {pool: layout.members(pool) for pool in POOL_NAMES if pool in layout.pool_gpus}

"""Invoke task modules, one per job; build_namespace() wires them into the Collection tasks.py exposes.

Every `invoke` command imports every task module, for its tasks' signatures and help, so a task module
imports at its top only what those need (invoke, the cli's own helpers, the constants its help shows); the
machinery a task runs (the deployment, SSH, the bench, pytest...) is imported in the function that uses it,
and type-only names under TYPE_CHECKING (tests/unit/cli/test_cli.py checks that loading the tasks stays
cheap)."""

from __future__ import annotations

from invoke import Collection

from pdfleet.cli import (
    bench,
    demo,
    doctor,
    keys,
    lab,
    monitor,
    plan,
    profiles,
    provision,
    rebalance,
    render,
    rollout,
    shadow,
    verify,
    wheel,
)


def build_namespace() -> Collection:
    """Every task, named explicitly; the lab's tasks under `lab.` (defaults come from invoke.yaml)."""
    ns = Collection(
        profiles.profiles,
        render.render,
        provision.provision,
        rebalance.rebalance,
        verify.verify,
        demo.demo,
        wheel.wheel,
        monitor.monitor,
        bench.bench,
        plan.plan,
        doctor.doctor,
    )
    ns.add_collection(rollout.collection())
    ns.add_collection(shadow.collection())
    ns.add_collection(keys.collection())
    ns.add_collection(
        Collection(
            "lab", lab.build_task, lab.up_task, lab.down_task, lab.status_task, lab.ssh_task, lab.env_task
        )
    )
    return ns

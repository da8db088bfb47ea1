"""Invoke task modules, one per job; build_namespace() wires them into the Collection tasks.py exposes."""

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

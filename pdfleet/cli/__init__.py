"""Invoke task modules, one per job; build_namespace() assembles them for tasks.py."""

from __future__ import annotations

import importlib

from invoke import Collection

# (module under pdfleet.cli, collection name or None to add its tasks at the top level)
TASK_MODULES: tuple[tuple[str, str | None], ...] = (
    ("profiles", None),
    ("render", None),
    ("provision", None),
    ("lab", "lab"),
    ("demo", None),
    ("verify", None),
)


def build_namespace() -> Collection:
    """One Collection holding every task module's tasks, with invoke.yaml defaults applied."""
    ns = Collection()
    for module_name, collection_name in TASK_MODULES:
        module = importlib.import_module(f"pdfleet.cli.{module_name}")
        sub = Collection.from_module(module)
        if collection_name is None:
            for task in sub.tasks.values():
                ns.add_task(task)
        else:
            ns.add_collection(sub, name=collection_name)
    return ns

"""Our inventory loader agrees with ansible-core's own `ansible-inventory --list` on hosts, groups, vars."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pdfleet.model.inventory import IMPLICIT_GROUPS, load_inventory

REPO = Path(__file__).resolve().parents[2]
REPO_INVENTORIES = sorted(
    p for pattern in ("**/*.yml", "**/*.yaml") for p in (REPO / "inventory").glob(pattern) if p.is_file()
)


def _ansible_inventory_bin() -> str:
    """ansible-inventory from the venv running the tests (a test-only dependency), else PATH."""
    local = Path(sys.executable).parent / "ansible-inventory"
    found = str(local) if local.exists() else shutil.which("ansible-inventory")
    if found is None:
        pytest.fail("ansible-inventory not found; install the test extra (ansible-core)")
    return found


def ansible_view(path: Path, tmp_path: Path) -> tuple[dict[str, set[str]], dict[str, dict[str, Any]]]:
    """(group -> transitive member hosts, host -> merged vars) as ansible-core sees the file."""
    config = tmp_path / "ansible.cfg"
    config.write_text("[defaults]\n")  # ignore any ansible.cfg/ANSIBLE_* setup of the machine
    env = {
        **os.environ,
        "ANSIBLE_INVENTORY_ENABLED": "yaml",  # no fallback to the ini/script plugins
        "ANSIBLE_INVENTORY_UNPARSED_FAILED": "True",
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"),
        "ANSIBLE_HOME": str(tmp_path / "ansible-home"),
        "ANSIBLE_CONFIG": str(config),
    }
    proc = subprocess.run(
        [_ansible_inventory_bin(), "-i", str(path), "--list"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    hostvars = data.pop("_meta", {}).get("hostvars", {})

    def members(group: str, seen: frozenset[str] = frozenset()) -> set[str]:
        body = data.get(group, {})
        hosts = set(body.get("hosts", []))
        for child in body.get("children", []):
            if child not in seen:
                hosts |= members(child, seen | {group})
        return hosts

    groups = {g: members(g) for g in data if g not in IMPLICIT_GROUPS}
    every_host = members("all") | set(hostvars)
    return groups, {h: hostvars.get(h, {}) for h in every_host}


def assert_same_as_ansible(path: Path, tmp_path: Path) -> None:
    """Hosts, group membership and merged vars of our loader equal ansible-inventory's."""
    groups, hostvars = ansible_view(path, tmp_path)
    inv = load_inventory(path)
    assert set(inv.hosts) == set(hostvars)
    ours = {g: set(members) for g, members in inv.groups.items()}
    # ansible-inventory omits groups without hosts or children; so may we, but never with members.
    assert {g: m for g, m in ours.items() if m} == {g: m for g, m in groups.items() if m}
    for name, host in inv.hosts.items():
        assert dict(host.vars) == hostvars[name], name
        expected_groups = {g for g, members in groups.items() if name in members}
        assert host.groups == expected_groups, name


def test_repo_has_inventories() -> None:
    """The glob below must find the shipped examples, or the parametrized test would prove nothing."""
    names = {p.relative_to(REPO).as_posix() for p in REPO_INVENTORIES}
    assert {"inventory/examples/same-host-pcie.yml", "inventory/examples/cross-rdma.yml"} <= names


@pytest.mark.parametrize("path", REPO_INVENTORIES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_repo_inventory_matches_ansible(path: Path, tmp_path: Path) -> None:
    assert_same_as_ansible(path, tmp_path)


# Precedence corner cases, each checked against ansible-core rather than against our own idea of it.
EDGE_CASES = {
    "child_group_beats_parent_and_host_beats_all": """
all:
  vars: {x: all, y: all, nested: {a: 1, b: 2}}
  children:
    gpu:
      vars: {x: gpu, nested: {a: 9}}
      children:
        prefill:
          vars: {y: prefill}
          hosts:
            p1: {x: host}
            p2:
""",
    "same_depth_groups_ordered_by_name": """
all:
  children:
    zeta:
      vars: {v: zeta}
      hosts: {h1: }
    alpha:
      vars: {v: alpha, w: alpha}
      hosts: {h1: }
    beta:
      vars: {w: beta}
      hosts: {h1: }
""",
    "group_priority_overrides_name_order": """
all:
  children:
    alpha:
      vars: {v: alpha, ansible_group_priority: 10}
      hosts: {h1: }
    zeta:
      vars: {v: zeta}
      hosts: {h1: }
""",
    "deeper_group_wins_over_shallower": """
all:
  children:
    z_parent:
      vars: {v: parent}
      children:
        a_child:
          vars: {v: child}
          hosts: {h1: }
    b_flat:
      vars: {v: flat}
      hosts: {h1: }
""",
    "host_listed_twice_merges_host_vars": """
all:
  children:
    prefill:
      hosts:
        same: {ansible_host: 10.0.0.5, a: 1}
    decode:
      hosts:
        same: {a: 2, b: 3}
""",
    "top_level_groups_and_ungrouped": """
all:
  vars: {site: lab}
  hosts:
    lonely: {ansible_port: 2201}
gateway:
  hosts:
    gw: {ansible_user: ops}
  vars: {port: 8080}
""",
    "group_reopened_under_two_parents": """
all:
  children:
    left:
      vars: {side: left}
      children:
        shared:
          hosts: {h1: }
    right:
      vars: {side: right, r: 1}
      children:
        shared:
          vars: {s: 1}
          hosts: {h2: }
""",
}


@pytest.mark.parametrize("name", sorted(EDGE_CASES))
def test_precedence_edge_cases_match_ansible(name: str, tmp_path: Path) -> None:
    path = tmp_path / f"{name}.yml"
    path.write_text(EDGE_CASES[name])
    assert_same_as_ansible(path, tmp_path)

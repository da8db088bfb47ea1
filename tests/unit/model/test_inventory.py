"""Inventory loader: typed hosts, inheritance, limit, bad inventories named by file and key path, and
agreement with ansible-core's own `ansible-inventory --list` on hosts, groups and merged vars."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pdfleet.errors import ValidationError
from pdfleet.model.inventory import IMPLICIT_GROUPS, load_inventory
from tests.unit.model.helpers import REPO, write

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py


def test_cross_rdma_example_hosts_and_inheritance() -> None:
    inv = load_inventory(REPO / "inventory/examples/cross-rdma.yml")
    assert [h.name for h in inv.group("prefill")] == ["pf-01", "pf-02"]
    assert [h.name for h in inv.group("decode")] == ["dc-01", "dc-02"]
    assert [h.name for h in inv.group("gateway")] == ["gw-01"]
    pf = inv.hosts["pf-01"]
    # hardware vars come from the parent group gpu_hosts, connection vars from all
    assert pf.gpus == (0, 1, 2, 3, 4, 5, 6, 7)
    assert pf.rdma_devices == ("mlx5_0",)
    assert pf.rdma_netdev == "ens1f0np0"
    assert (pf.address, pf.port, pf.user) == ("10.20.1.11", 22, "ops")
    assert pf.key_file == "~/.ssh/pdfleet_ed25519"
    assert pf.groups == frozenset({"gpu_hosts", "prefill"})
    assert pf.in_group("prefill") and pf.in_group("all") and not pf.in_group("decode")
    # host vars win over the group's
    dc2 = inv.hosts["dc-02"]
    assert dc2.rdma_devices == ("mlx5_1",) and dc2.rdma_netdev == "ens2f0np0"
    gw = inv.hosts["gw-01"]
    assert gw.groups == frozenset({"gateway", "monitoring"}) and gw.gpus == ()


def test_same_host_example_puts_hosts_in_both_pools() -> None:
    inv = load_inventory(REPO / "inventory/examples/same-host-pcie.yml")
    both = {h.name for h in inv.group("prefill")} & {h.name for h in inv.group("decode")}
    assert both == {"pd-01", "pd-02"}
    assert inv.hosts["pd-02"].port == 2222


def test_defaults_and_known_hosts(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
all:
  hosts:
    bare:
    custom: {pdfleet_known_hosts_file: /etc/kh, ansible_port: "2200"}
""",
    )
    inv = load_inventory(path, known_hosts_default="~/.ssh/known_hosts")
    bare = inv.hosts["bare"]
    assert (bare.address, bare.port, bare.user, bare.key_file) == ("bare", 22, "root", None)
    assert bare.known_hosts_file == "~/.ssh/known_hosts"
    assert inv.hosts["custom"].known_hosts_file == "/etc/kh"
    assert inv.hosts["custom"].port == 2200
    assert bare.groups == frozenset()


def test_limit_by_host_and_group() -> None:
    inv = load_inventory(REPO / "inventory/examples/cross-rdma.yml")
    sub = inv.limit("decode,gw-01")
    assert list(sub.hosts) == ["dc-01", "dc-02", "gw-01"]
    assert sub.groups["prefill"] == ()
    assert [h.name for h in sub.group("decode")] == ["dc-01", "dc-02"]
    assert inv.limit(None) is inv
    assert list(inv.limit("all").hosts) == list(inv.hosts)


def test_limit_unknown_name_lists_known_ones() -> None:
    inv = load_inventory(REPO / "inventory/examples/cross-rdma.yml")
    with pytest.raises(ValidationError) as err:
        inv.limit("pf-01,nosuch")
    message = str(err.value)
    assert "unknown host or group nosuch" in message
    assert "pf-01, pf-02, dc-01, dc-02, colo-01, colo-02, colo-03, colo-04, gw-01" in message
    assert "prefill" in message


def test_vars_are_read_only() -> None:
    inv = load_inventory(REPO / "inventory/examples/colocated.yml")
    with pytest.raises(TypeError):
        inv.hosts["colo-01"].vars["gpus"] = [9]  # type: ignore[index]


# (id, inventory text, expected "FILE: ..." suffix pieces after the file name)
BAD_INVENTORIES = [
    ("yaml_syntax", "all:\n  hosts:\n    a: {ansible_host: [1,\n", ":4:1: invalid YAML"),
    (
        "duplicate_key",
        "all:\n  hosts:\n    a:\n      gpus: [0]\n      gpus: [1]\n",
        ":5:7: invalid YAML: while constructing a mapping found duplicate key 'gpus'",
    ),
    (
        "unknown_group_key",
        "all:\n  children:\n    prefill:\n      host:\n        a:\n",
        ": all.children.prefill.host: unknown key; a group allows only hosts, children, vars",
    ),
    (
        "gpus_not_a_list",
        "all:\n  children:\n    prefill:\n      hosts:\n        p1: {gpus: 8}\n",
        ": all.children.prefill.hosts.p1.gpus: must be a list of GPU indices (non-negative integers)",
    ),
    (
        "bad_group_var_points_at_group",
        "all:\n  children:\n    gpu:\n      vars: {gpus: [0, -1]}\n      hosts: {p1: }\n",
        ": all.children.gpu.vars.gpus: must be a list of GPU indices",
    ),
    (
        "gpu_listed_twice",
        "all:\n  hosts:\n    p1: {gpus: [0, 1, 1]}\n",
        ": all.hosts.p1.gpus: lists a GPU index twice (got [0, 1, 1])",
    ),
    (
        "port_out_of_range",
        "all:\n  hosts:\n    p1: {ansible_port: 70000}\n",
        ": all.hosts.p1.ansible_port: must be a port number 1-65535 (got 70000)",
    ),
    (
        "rdma_devices_string",
        "all:\n  hosts:\n    p1: {rdma_devices: mlx5_0}\n",
        ": all.hosts.p1.rdma_devices: must be a list of RDMA device names, e.g. [mlx5_0]",
    ),
    (
        "children_cycle",
        "all:\n  children:\n    a:\n      children:\n        b:\n          children:\n            a:\n",
        ": children: groups form a cycle: a -> b -> a",
    ),
    (
        "hosts_as_list",
        "all:\n  children:\n    decode:\n      hosts: [d1, d2]\n",
        ": all.children.decode.hosts: must be a mapping of host name to vars (got a list)",
    ),
    (
        "host_range",
        "all:\n  hosts:\n    gpu[01:04]:\n",
        ": all.hosts.gpu[01:04]: host ranges like web[01:10] are not supported",
    ),
    ("empty_file", "", ": (top level): the inventory is empty"),
    ("top_level_list", "- a\n- b\n", ": (top level): must be a mapping of groups"),
    (
        "empty_address",
        "all:\n  hosts:\n    p1: {ansible_host: ''}\n",
        ": all.hosts.p1.ansible_host: must be a non-empty string",
    ),
    # issue 18 C1: a newline in a var pdfleet writes into files would add a line to them
    (
        "newline_in_address",
        'all:\n  hosts:\n    p1: {ansible_host: "10.0.0.1\\nExecStartPre=/bin/sh"}\n',
        ": all.hosts.p1.ansible_host: contains the control character U+000A (LINE FEED)",
    ),
    (
        "newline_in_group_var",
        'all:\n  vars: {ansible_user: "ops\\rroot"}\n  hosts: {p1: }\n',
        ": all.vars.ansible_user: contains the control character U+000D (CARRIAGE RETURN)",
    ),
    (
        "newline_in_rdma_device",
        'all:\n  hosts:\n    p1: {rdma_devices: ["mlx5_0\\nx"]}\n',
        ": all.hosts.p1.rdma_devices: must be a list of RDMA device names",
    ),
    (
        "newline_in_host_name",
        'all:\n  hosts:\n    "p1\\nx": {}\n',
        ": all.hosts: a key 'p1\\nx' contains the control character U+000A",
    ),
    (
        "address_not_a_host_name",
        "all:\n  hosts:\n    p1: {ansible_host: 'http://10.0.0.1/'}\n",
        ": all.hosts.p1.ansible_host: 'http://10.0.0.1/' is not a host name",
    ),
    # issue 18 C2: host names become directories under `invoke render --out`
    ("host_name_parent_dir", "all:\n  hosts:\n    ../../x: {}\n", ": all.hosts.../../x: '../../x' is not"),
    ("host_name_absolute", "all:\n  hosts:\n    /abs: {}\n", ": all.hosts./abs: '/abs' is not a host name"),
    ("host_name_dot", "all:\n  hosts:\n    '.': {}\n", "'.' is not a host name"),
    ("host_name_slash", "all:\n  hosts:\n    a/b: {}\n", "'a/b' is not a host name"),
    ("host_name_trailing_dash", "all:\n  hosts:\n    gpu-: {}\n", "'gpu-' is not a host name"),
    ("host_name_space", "all:\n  hosts:\n    'gpu 1': {}\n", "'gpu 1' is not a host name"),
    # issue 27 N13: a key pasted into the wrong variable, short enough to fit an excerpt, was printed whole
    (
        "a_short_key_as_a_port",
        "all:\n  hosts:\n    p1: {ansible_port: sk-user-0123456789abcdef}\n",
        ": all.hosts.p1.ansible_port: must be a port number 1-65535 (got 'sk-u'... (24 characters))",
    ),
    # issue 18 C5: a key file given as the inventory must not be printed back
    (
        "a_key_file",
        "sk-pdfleet-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789abcdefg\n",
        ": (top level): must be a mapping of groups, e.g. `all:` (got the string 'sk-p'... (54 characters))",
    ),
]

# Names Ansible's inventory accepts (ansible.parsing.utils.addresses) and so must pdfleet.
GOOD_HOST_NAMES = ["gpu01", "gpu-01.dc1.example.com", "GPU_1", "_p1", "10.20.1.11", "fe80::1", "a"]


@pytest.mark.parametrize("name", GOOD_HOST_NAMES)
def test_host_names_ansible_allows_are_accepted(tmp_path: Path, name: str) -> None:
    path = write(tmp_path, f"all:\n  hosts:\n    '{name}': {{ansible_host: '{name}'}}\n")
    inv = load_inventory(path)
    assert list(inv.hosts) == [name] and inv.hosts[name].address == name


def test_vars_pdfleet_does_not_use_may_span_lines(tmp_path: Path) -> None:
    path = write(tmp_path, "all:\n  hosts:\n    p1:\n      motd: |\n        two\n        lines\n")
    assert load_inventory(path).hosts["p1"].vars["motd"] == "two\nlines\n"


def test_a_key_file_as_inventory_does_not_print_the_key(tmp_path: Path) -> None:
    key = "sk-pdfleet-" + "Zq9" * 14
    for text in (key + "\n", f"all: {key}\n", f"all:\n  hosts:\n    p1: {{ansible_port: {key}}}\n"):
        with pytest.raises(ValidationError) as err:
            load_inventory(write(tmp_path, text))
        assert "Zq9Zq9" not in str(err.value), str(err.value)


@pytest.mark.parametrize(("case", "text", "expected"), BAD_INVENTORIES, ids=[c[0] for c in BAD_INVENTORIES])
def test_bad_inventory_names_file_and_key_path(tmp_path: Path, case: str, text: str, expected: str) -> None:
    path = write(tmp_path, text, f"{case}.yml")
    with pytest.raises(ValidationError) as err:
        load_inventory(path)
    message = str(err.value)
    assert message.startswith(str(path)), message
    assert expected in message, message
    assert "\n" not in message  # one paragraph


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="nope.yml: file not found"):
        load_inventory(tmp_path / "nope.yml")


# --------------------------------------------------------------------------- against ansible-inventory


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


def test_the_host_names_pdfleet_accepts_are_ones_ansible_lists(tmp_path: Path) -> None:
    body = "".join(f"    '{name}': {{}}\n" for name in GOOD_HOST_NAMES)
    path = write(tmp_path, f"all:\n  hosts:\n{body}")
    _, hostvars = ansible_view(path, tmp_path)
    assert set(hostvars) == set(GOOD_HOST_NAMES) == set(load_inventory(path).hosts)

"""Inventory loader: typed hosts, inheritance, limit, and bad inventories named by file and key path."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdfleet.errors import ValidationError
from pdfleet.model.inventory import load_inventory

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str, name: str = "inv.yml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


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
    assert "pf-01, pf-02, dc-01, dc-02, gw-01" in message and "prefill" in message


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
]


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

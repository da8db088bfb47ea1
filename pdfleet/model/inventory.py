"""Ansible-format YAML inventories (the `all`/`children`/`hosts`/`vars` subset), merged as Ansible does.

Variable precedence follows ansible-core: a host's groups are ordered by (depth below `all`,
`ansible_group_priority`, name) and their vars applied in that order, so `all` < parent groups <
child groups; host vars win over every group. Dict values replace, they are not deep-merged
(Ansible's default `hash_behaviour=replace`). A test runs `ansible-inventory --list` on every
inventory in the repo and compares hosts, groups and merged vars with this loader.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pdfleet.errors import ValidationError
from pdfleet.model.yamlfile import control_character, excerpt, read_yaml

GROUP_KEYS = ("hosts", "children", "vars")
# Groups ansible-core creates by itself; never listed in Host.groups.
IMPLICIT_GROUPS = frozenset({"all", "ungrouped"})
_HOST_RANGE = re.compile(r"\[[^\]]*:[^\]]*\]")
# Ansible's host name pattern (ansible.parsing.utils.addresses, without ranges), in ASCII: dot-separated
# labels of letters, digits, `_` and `-`, not ending in `_` or `-`. Host names become directories of
# `invoke render --out`, so nothing else (no `/`, no `..`) may be one.
_LABEL = r"(?:[A-Za-z0-9]|[A-Za-z0-9_][A-Za-z0-9_-]*[A-Za-z0-9])"
_HOST_NAME = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*$")


# --------------------------------------------------------------------------- public model


@dataclass(frozen=True)
class Host:
    """One inventory host with its merged vars and the connection/hardware facts pdfleet uses."""

    name: str
    groups: frozenset[str]
    vars: Mapping[str, Any]
    address: str
    port: int = 22
    user: str = "root"
    key_file: str | None = None
    known_hosts_file: str | None = None
    gpus: tuple[int, ...] = ()
    rdma_devices: tuple[str, ...] = ()
    rdma_netdev: str | None = None

    def in_group(self, group: str) -> bool:
        """Whether the host is in `group` (directly or through children); every host is in `all`."""
        return group == "all" or group in self.groups


@dataclass(frozen=True)
class Inventory:
    """Hosts in file order and group membership (transitive through children)."""

    source: Path
    hosts: dict[str, Host]
    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def group(self, name: str) -> list[Host]:
        """Hosts in a group, in file order; an unknown group is simply empty."""
        if name == "all":
            return list(self.hosts.values())
        return [self.hosts[h] for h in self.groups.get(name, ())]

    def limit(self, spec: str | None) -> Inventory:
        """The sub-inventory for an Ansible-like `--limit` of comma-separated host and group names."""
        if not spec or not spec.strip():
            return self
        wanted: set[str] = set()
        unknown: list[str] = []
        for item in (part.strip() for part in spec.split(",")):
            if not item:
                continue
            if item in self.hosts:
                wanted.add(item)
            elif item == "all":
                wanted.update(self.hosts)
            elif item in self.groups:
                wanted.update(self.groups[item])
            else:
                unknown.append(item)
        if unknown:
            raise ValidationError(
                f"--limit {spec!r}: unknown host or group {', '.join(unknown)} in {self.source}; "
                f"hosts: {', '.join(self.hosts) or '(none)'}; groups: {', '.join(self.groups) or '(none)'}"
            )
        hosts = {name: host for name, host in self.hosts.items() if name in wanted}
        groups = {g: tuple(h for h in members if h in wanted) for g, members in self.groups.items()}
        return Inventory(source=self.source, hosts=hosts, groups=groups)


# --------------------------------------------------------------------------- parsing


@dataclass
class _Group:
    """A group while parsing: its own vars (with where each was set), direct hosts, child groups."""

    name: str
    vars: dict[str, tuple[Any, str]] = field(default_factory=dict)
    hosts: list[str] = field(default_factory=list)
    children: list[str] = field(default_factory=list)
    parents: set[str] = field(default_factory=set)
    depth: int = 0


@dataclass
class _Parse:
    """Mutable parse state: groups and hosts in order of first appearance."""

    path: Path
    groups: dict[str, _Group] = field(default_factory=dict)
    host_vars: dict[str, dict[str, tuple[Any, str]]] = field(default_factory=dict)

    def fail(self, where: str, message: str) -> ValidationError:
        """A ValidationError naming the inventory file and key path."""
        return ValidationError(f"{self.path}: {where}: {message}")

    def group(self, name: str) -> _Group:
        """The group called `name`, created on first mention."""
        if name not in self.groups:
            self.groups[name] = _Group(name)
        return self.groups[name]


def _parse_group(state: _Parse, name: str, data: Any, where: str) -> None:
    """Parse one group body (`hosts`, `children`, `vars`), recursing into children."""
    if not isinstance(name, str) or not name:
        raise state.fail(where, "group names must be non-empty strings")
    group = state.group(name)
    if data is None:
        return
    if not isinstance(data, dict):
        raise state.fail(
            where, f"a group must be a mapping with keys {', '.join(GROUP_KEYS)} (got {_kind(data)})"
        )
    for key in data:
        if key not in GROUP_KEYS:
            raise state.fail(f"{where}.{key}", f"unknown key; a group allows only {', '.join(GROUP_KEYS)}")
    _parse_vars(state, group.vars, data.get("vars"), f"{where}.vars")
    _parse_hosts(state, group, data.get("hosts"), f"{where}.hosts")
    children = data.get("children")
    if children is None:
        return
    if not isinstance(children, dict):
        raise state.fail(f"{where}.children", f"must be a mapping of group names (got {_kind(children)})")
    for child_name, child_data in children.items():
        child_where = f"{where}.children.{child_name}"
        if child_name == "all":
            raise state.fail(child_where, "`all` cannot be a child group")
        if child_name not in group.children:
            group.children.append(child_name)
        state.group(child_name).parents.add(name)
        _parse_group(state, child_name, child_data, child_where)


def _parse_hosts(state: _Parse, group: _Group, hosts: Any, where: str) -> None:
    """Register a group's hosts and their vars (a host listed twice merges its vars, later wins)."""
    if hosts is None:
        return
    if not isinstance(hosts, dict):
        raise state.fail(where, f"must be a mapping of host name to vars (got {_kind(hosts)})")
    for host_name, host_data in hosts.items():
        host_where = f"{where}.{host_name}"
        if not isinstance(host_name, str) or not host_name:
            raise state.fail(host_where, "host names must be non-empty strings")
        if _HOST_RANGE.search(host_name):
            raise state.fail(host_where, "host ranges like web[01:10] are not supported; list each host")
        problem = host_name_problem(host_name)
        if problem:
            raise state.fail(host_where, problem)
        host_vars = state.host_vars.setdefault(host_name, {})
        if host_name not in group.hosts:
            group.hosts.append(host_name)
        _parse_vars(state, host_vars, host_data, host_where)


def _parse_vars(state: _Parse, target: dict[str, tuple[Any, str]], data: Any, where: str) -> None:
    """Record vars with the key path they were set at, so later errors can point there."""
    if data is None:
        return
    if not isinstance(data, dict):
        raise state.fail(where, f"vars must be a mapping (got {_kind(data)})")
    for key, value in data.items():
        if not isinstance(key, str):
            raise state.fail(f"{where}.{key}", "variable names must be strings")
        target[key] = (value, f"{where}.{key}")


def _set_depths(state: _Parse) -> None:
    """Depth below `all` as ansible-core computes it (longest path), failing on a children cycle."""
    visiting: list[str] = []

    def visit(name: str, depth: int) -> None:
        if name in visiting:
            cycle = " -> ".join([*visiting[visiting.index(name) :], name])
            raise state.fail("children", f"groups form a cycle: {cycle}")
        group = state.groups[name]
        if name != "all" and depth <= group.depth:
            return
        group.depth = max(group.depth, depth)
        visiting.append(name)
        for child in group.children:
            visit(child, depth + 1)
        visiting.pop()

    visit("all", 0)


def _ancestors(state: _Parse, name: str) -> set[str]:
    """Every group that contains `name` through children links, plus `name` itself."""
    seen: set[str] = set()
    stack = [name]
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        stack.extend(state.groups[current].parents)
    return seen


def _group_priority(state: _Parse, group: _Group) -> int:
    """`ansible_group_priority` (default 1), used by Ansible to order groups of equal depth."""
    value, where = group.vars.get("ansible_group_priority", (1, ""))
    if isinstance(value, bool) or not isinstance(value, int):
        raise state.fail(where, f"must be an integer (got {excerpt(value)})")
    return value


def _host_groups(state: _Parse) -> dict[str, set[str]]:
    """For each host, every group it belongs to (direct groups and their ancestors, incl. all)."""
    result: dict[str, set[str]] = {name: set() for name in state.host_vars}
    for group in state.groups.values():
        for host in group.hosts:
            result[host] |= _ancestors(state, group.name)
    for groups in result.values():
        if groups <= IMPLICIT_GROUPS:
            groups.add("ungrouped")  # as ansible-core: hosts in no other group are in `ungrouped`
        groups.add("all")
    return result


def _merged_vars(state: _Parse, host: str, groups: set[str]) -> dict[str, tuple[Any, str]]:
    """Ansible's merge: groups by (depth, priority, name), then host vars on top."""
    ordered = sorted(
        (state.groups[g] for g in groups),
        key=lambda g: (g.depth, _group_priority(state, g), g.name),
    )
    merged: dict[str, tuple[Any, str]] = {}
    for group in ordered:
        merged.update(group.vars)
    merged.update(state.host_vars[host])
    merged.pop("ansible_group_priority", None)  # consumed by Ansible as group ordering, not a host var
    return merged


# --------------------------------------------------------------------------- typed vars


def _port(value: Any, where: str, state: _Parse) -> int:
    """A TCP port from an int or digit string (Ansible accepts both)."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise state.fail(where, f"must be a port number 1-65535 (got {excerpt(value)})")
    return value


def host_name_problem(name: str) -> str | None:
    """Why a string is not a host name or address Ansible's inventory accepts (None: it is one)."""
    if _HOST_NAME.match(name):
        return None
    try:
        ipaddress.ip_address(name)
        return None
    except ValueError:
        pass
    return (
        f"{excerpt(name)} is not a host name: use letters, digits, '-' and '_' in dot-separated labels "
        "(as Ansible's inventory does) or an IP address"
    )


def _opt_str(merged: dict[str, tuple[Any, str]], key: str, state: _Parse) -> str | None:
    """An optional non-empty, one-line string var (pdfleet writes these into unit and config files)."""
    if key not in merged or merged[key][0] is None:
        return None
    value, where = merged[key]
    if not isinstance(value, str) or not value.strip():
        raise state.fail(where, f"must be a non-empty string (got {excerpt(value)})")
    char = control_character(value)
    if char:
        raise state.fail(where, f"contains the control character {char}; it must be one line of text")
    return value


def _address(merged: dict[str, tuple[Any, str]], state: _Parse) -> str | None:
    """`ansible_host`: a host name or IP address (it goes into URLs, unit files and the policy)."""
    value = _opt_str(merged, "ansible_host", state)
    problem = host_name_problem(value) if value is not None else None
    if problem:
        raise state.fail(merged["ansible_host"][1], problem)
    return value


def _gpus(merged: dict[str, tuple[Any, str]], state: _Parse) -> tuple[int, ...]:
    """`gpus`: a list of distinct non-negative GPU indices."""
    if "gpus" not in merged or merged["gpus"][0] is None:
        return ()
    value, where = merged["gpus"]
    ok = isinstance(value, list) and all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value
    )
    if not ok:
        raise state.fail(
            where,
            f"must be a list of GPU indices (non-negative integers), e.g. [0, 1] (got {excerpt(value)})",
        )
    if len(set(value)) != len(value):
        raise state.fail(where, f"lists a GPU index twice (got {excerpt(value)})")
    return tuple(value)


def _rdma_devices(merged: dict[str, tuple[Any, str]], state: _Parse) -> tuple[str, ...]:
    """`rdma_devices`: a list of RDMA device names such as mlx5_0."""
    if "rdma_devices" not in merged or merged["rdma_devices"][0] is None:
        return ()
    value, where = merged["rdma_devices"]
    ok = isinstance(value, list) and all(isinstance(d, str) and d and not control_character(d) for d in value)
    if not ok:
        raise state.fail(where, f"must be a list of RDMA device names, e.g. [mlx5_0] (got {excerpt(value)})")
    return tuple(value)


def _build_host(state: _Parse, name: str, groups: set[str], known_hosts_default: str | None) -> Host:
    """A typed Host from the merged vars; bad connection/hardware vars name where they were set."""
    merged = _merged_vars(state, name, groups)
    port = _port(*merged["ansible_port"], state) if "ansible_port" in merged else 22
    known_hosts = _opt_str(merged, "pdfleet_known_hosts_file", state) or known_hosts_default
    return Host(
        name=name,
        groups=frozenset(groups - IMPLICIT_GROUPS),
        vars=MappingProxyType({key: value for key, (value, _) in merged.items()}),
        address=_address(merged, state) or name,
        port=port,
        user=_opt_str(merged, "ansible_user", state) or "root",
        key_file=_opt_str(merged, "ansible_ssh_private_key_file", state),
        known_hosts_file=known_hosts,
        gpus=_gpus(merged, state),
        rdma_devices=_rdma_devices(merged, state),
        rdma_netdev=_opt_str(merged, "rdma_netdev", state),
    )


def _iter_top(state: _Parse, data: Any) -> Iterator[tuple[str, Any]]:
    """Top-level groups; like Ansible, any top-level group other than `all` is a child of `all`."""
    if data is None:
        raise state.fail("(top level)", "the inventory is empty; expected a mapping with an `all` group")
    if not isinstance(data, dict):
        raise state.fail("(top level)", f"must be a mapping of groups, e.g. `all:` (got {_kind(data)})")
    yield from data.items()


def load_inventory(path: str | Path, known_hosts_default: str | None = None) -> Inventory:
    """Read and validate an inventory file; errors name the file and the key path."""
    path = Path(path)
    state = _Parse(path)
    state.group("all").children.append("ungrouped")
    state.group("ungrouped").parents.add("all")
    # Values may hold anything Ansible allows; the vars pdfleet uses are checked where they are typed.
    for name, body in _iter_top(state, read_yaml(path, check_values=False)):
        _parse_group(state, name, body, str(name))
        if name != "all" and name not in state.groups["all"].children:
            state.groups["all"].children.append(name)
            state.groups[name].parents.add("all")
    _set_depths(state)
    host_groups = _host_groups(state)
    hosts = {
        name: _build_host(state, name, host_groups[name], known_hosts_default) for name in state.host_vars
    }
    groups: dict[str, tuple[str, ...]] = {}
    for group_name in state.groups:
        if group_name in IMPLICIT_GROUPS:
            continue
        groups[group_name] = tuple(h for h in hosts if group_name in hosts[h].groups)
    return Inventory(source=path, hosts=hosts, groups=groups)


def _kind(value: Any) -> str:
    """A short YAML-ish name for a value's type, for error messages."""
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return f"the string {excerpt(value)}"
    return excerpt(value)

"""A deployment: one validated profile and inventory, their topology and the roles to run, built once
per command and passed down; `context(host)` is what the roles see of one host."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pdfleet.fleet.host_wheel import host_version
from pdfleet.fleet.render import Renderer
from pdfleet.fleet.roles import Role, RoleContext
from pdfleet.fleet.secrets import GatewaySecrets
from pdfleet.fleet.topology import Topology, build_topology
from pdfleet.model.inventory import Host, Inventory, load_inventory
from pdfleet.model.inventory_checks import check_against_inventory
from pdfleet.model.profile import Profile
from pdfleet.model.profile_loader import load_profile

GATEWAY_ROLE = "gateway"  # the role that installs the gateway's keys (roles/gateway)
ROLLOUT_ROLE = "rollout"  # installs the admin key for the rollout controller (roles/rollout)


@dataclass(frozen=True)
class Deployment:
    """Profile, inventory, topology and roles of one command (see the module docstring)."""

    profile: Profile
    inventory: Inventory
    topology: Topology
    roles: tuple[Role, ...]
    renderer: Renderer
    host_version: str
    gateway_secrets: GatewaySecrets | None = None
    host_wheel: Path | None = None  # uploaded by the roles of hosts that run pdfleet code
    stage_override: str | None = None  # `invoke provision --stage S`

    def context(self, host: Host) -> RoleContext:
        """What the roles see for one host."""
        return RoleContext(
            host,
            self.profile,
            self.topology,
            self.renderer,
            self.host_version,
            self.gateway_secrets,
            self.host_wheel,
            self.stage_override,
        )

    def needs_gateway_keys(self, hosts: Iterable[Host]) -> bool:
        """Whether the gateway role runs on one of these hosts: only then are the keys read or generated."""
        names = {role.NAME for role in self.roles}
        if GATEWAY_ROLE in names and any(self.topology.gateway_on(host.name) for host in hosts):
            return True
        controller = self.topology.controller
        return (
            ROLLOUT_ROLE in names
            and controller is not None
            and any(host.name == controller.host.name for host in hosts)
        )


def load_deployment(
    profile: str,
    inventory: str | Path,
    profiles_dir: Path,
    templates_dir: Path,
    roles: Sequence[Role],
    lab_network: ipaddress.IPv4Network | None = None,
    gateway_secrets: GatewaySecrets | None = None,
) -> Deployment:
    """Load and cross-check profile and inventory; raise ValidationError before anything is touched.

    Without `gateway_secrets` the gateway role has no keys to install (it skips, saying so)."""
    prof = load_profile(profile, profiles_dir)
    inv = load_inventory(inventory)
    check_against_inventory(prof, inv)
    topology = build_topology(prof, inv, lab_network)
    return Deployment(
        prof, inv, topology, tuple(roles), Renderer(templates_dir), host_version(), gateway_secrets
    )

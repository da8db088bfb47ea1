"""The lab, plugged into the fleet tasks: its network says which hosts are lab hosts, its bridge must be
up before they are addressed, and its PyPI mirror must serve the current host wheel."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pdfleet.errors import ConnectError
from pdfleet.lab.network import lab_route_problem
from pdfleet.lab.paths import NETWORK

if TYPE_CHECKING:
    from pdfleet.fleet.deployment import Deployment
    from pdfleet.model.inventory import Host

LAB_NETWORK = NETWORK


def require_routable(hosts: Sequence[Host]) -> None:
    """Refuse to connect to lab addresses while the lab is down (the traffic would leave this machine)."""
    problem = lab_route_problem(h.address for h in hosts)
    if problem:
        raise ConnectError(problem)


def serve_host_wheel(deployment: Deployment) -> None:
    """When lab hosts run pdfleet code and the profile's PyPI mirror is the lab's own and runs, put the
    current host wheel on it, so the version provision pins is there for the hosts that install it from
    the index."""
    from pdfleet.lab.mirrors import refresh_if_served_here

    topology = deployment.topology
    if topology.lab_hosts & topology.pdfleet_hosts:
        refresh_if_served_here(deployment.profile.mirrors.pypi)

"""The lab bridge pdlab0: the only network the lab hosts have (no default route, no NAT)."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from pathlib import Path

from pdfleet.lab.paths import BRIDGE, BRIDGE_ADDRESS, NETWORK
from pdfleet.lab.system import run

ARP_RETRANS_MS = 250  # on the bridge: how long the kernel waits for each ARP answer (its default: 1000)


def link_exists(name: str) -> bool:
    """Whether a network interface with this name exists on the control machine."""
    return Path(f"/sys/class/net/{name}").exists()


def ensure_bridge(name: str = BRIDGE, address: str = BRIDGE_ADDRESS) -> bool:
    """Create (or repair) the bridge with its address; True when it was created now."""
    created = not link_exists(name)
    if created:
        run(["ip", "link", "add", name, "type", "bridge"])
    # No IPv6 on the lab segment: the hosts get IPv4 statics only, nothing autoconfigures.
    ipv6 = Path(f"/proc/sys/net/ipv6/conf/{name}/disable_ipv6")
    if ipv6.exists():
        ipv6.write_text("1\n")
    # Never route lab traffic onwards, even if a host added a route of its own and the machine
    # forwards: IPv4 forwarding is decided per ingress interface.
    Path(f"/proc/sys/net/ipv4/conf/{name}/forwarding").write_text("0\n")
    # A lab host that is down answers no ARP: a connection to it fails once the kernel's 3 probes went
    # unanswered, 3 s at the default 1 s apart, and provision's 3 attempts took 11 s (the powered-off-host
    # lab test). The hosts share this kernel and answer ARP at once: 250 ms apart is ample here.
    Path(f"/proc/sys/net/ipv4/neigh/{name}/retrans_time_ms").write_text(f"{ARP_RETRANS_MS}\n")
    cidr = f"{address}/{NETWORK.prefixlen}"
    current = run(["ip", "-o", "-4", "addr", "show", "dev", name]).stdout
    if f" {cidr} " not in current:
        run(["ip", "addr", "replace", cidr, "dev", name])
    run(["ip", "link", "set", name, "up"])
    return created


def remove_link(name: str) -> None:
    """Delete an interface if it exists (safe to call twice)."""
    if link_exists(name):
        run(["ip", "link", "del", name], check=False)


def host_veth(machine: str) -> str:
    """The host-side veth name systemd-nspawn gives a machine on --network-bridge (IFNAMSIZ-limited)."""
    return f"vb-{machine}"[:15]


def lab_route_problem(addresses: Iterable[str]) -> str | None:
    """Why connecting to these addresses is unsafe now, or None: hosts on the lab network are reached
    only through the lab's bridge; with the lab down, packets to them would leave this machine."""
    on_lab = []
    for address in addresses:
        try:
            if ipaddress.ip_address(address) in NETWORK:
                on_lab.append(address)
        except ValueError:  # a host name: not a lab address
            continue
    if on_lab and not link_exists(BRIDGE):
        return (
            f"{', '.join(on_lab)} {'is' if len(on_lab) == 1 else 'are'} on the lab network {NETWORK}, "
            f"but the lab is down (no bridge {BRIDGE}); run `invoke lab.up` first"
        )
    return None

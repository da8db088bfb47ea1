"""RDMA decisions: declared devices checked against sysfs, the RoCE v2 GID index computed, QoS planned.

The GID index is never assumed to be 3: it is the RoCE v2 entry whose GID is the IPv4-mapped
address of the host's `rdma_netdev` (reference/provisioning.md §2.2). QoS follows the mlnx-tools
sequence (trust dscp, PFC on one priority, DSCP→priority) with mlnx_qos where present and
iproute2 `dcb` otherwise (§2.4). The RDMA stack is the distribution's inbox rdma-core unless DOCA-OFED
(or MLNX_OFED) is installed, whose own rdma-core the distribution's packages must not replace (§2.1).
Everything here is pure and tested against fixtures.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pdfleet.hw.rdma_facts import Gid, NetdevInfo, QosState, QosTools, RdmaDevice

if TYPE_CHECKING:
    from pdfleet.model.profile import RdmaSpec

ROCE_V2 = "RoCE v2"
PORT = 1  # ConnectX Ethernet functions expose one port per RDMA device


# The inbox RDMA userspace (Debian and Ubuntu name it alike, reference/provisioning.md §2.1).
INBOX_PACKAGES: tuple[str, ...] = (
    "rdma-core",
    "ibverbs-providers",
    "ibverbs-utils",
    "rdmacm-utils",
    "infiniband-diags",
    "perftest",
)
DOCA_PACKAGES = ("doca-ofed", "doca-ofed-userspace")


@dataclass(frozen=True)
class RdmaStack:
    """Which RDMA userspace the host runs: the distribution's (install the inbox packages) or DOCA-OFED's."""

    doca: bool
    reason: str


def rdma_stack(installed: dict[str, str | None]) -> RdmaStack:
    """DOCA-OFED when its packages are installed or rdma-core is NVIDIA's build (version `...mlnx...`, e.g.
    2410mlnx54-1.2410068); otherwise the inbox rdma-core."""
    doca = next((f"{p} {installed[p]}" for p in DOCA_PACKAGES if installed.get(p)), None)
    core = installed.get("rdma-core") or ""
    if doca is None and "mlnx" in core:
        doca = f"rdma-core {core}"
    if doca is None:
        return RdmaStack(False, f"inbox rdma-core{' ' + core if core else ''} from the distribution")
    return RdmaStack(
        True,
        f"DOCA-OFED is installed ({doca}): the distribution's RDMA packages would replace its libraries "
        "(e.g. perftest pulls the distribution's librdmacm); install missing tools from the DOCA repository",
    )


class RdmaError(ValueError):
    """A declared RDMA setting the host contradicts; the message names the device."""


def check_devices(declared: tuple[str, ...], found: dict[str, RdmaDevice]) -> list[str]:
    """Problems with the declared rdma_devices: missing devices, ports not ACTIVE or not Ethernet."""
    problems = []
    have = ", ".join(sorted(found)) or "none"
    for name in declared:
        dev = found.get(name)
        if dev is None:
            problems.append(
                f"rdma_devices declares {name}, but the host has no such RDMA device (found: {have})"
            )
            continue
        port = dev.port(PORT)
        if port is None:
            problems.append(f"{name} has no port {PORT} in /sys/class/infiniband/{name}/ports")
            continue
        if port.state != "ACTIVE":
            problems.append(f"{name} port {PORT} is {port.state or 'in an unknown state'}, not ACTIVE")
        if port.link_layer != "Ethernet":
            layer = port.link_layer or "unknown"
            problems.append(f"{name} port {PORT} link layer is {layer}, not Ethernet (RoCE)")
    return problems


def netdev_of(found: dict[str, RdmaDevice], declared: tuple[str, ...]) -> dict[str, str]:
    """Declared RDMA device → its (first) netdev, for the devices that have one."""
    return {d: found[d].netdevs[0] for d in declared if d in found and found[d].netdevs}


def roce_v2_gids(dev: RdmaDevice, netdev: str | None, addresses: tuple[str, ...]) -> list[Gid]:
    """RoCE v2 GIDs of port 1 that are IPv4-mapped, on `netdev` and (when known) one of its addresses."""
    port = dev.port(PORT)
    if port is None:
        return []
    out = []
    for gid in port.gids:
        if gid.type != ROCE_V2 or gid.ipv4 is None:
            continue
        if netdev and gid.ndev and gid.ndev != netdev:
            continue
        if addresses and gid.ipv4 not in addresses:
            continue
        out.append(gid)
    return out


def compute_gid_index(
    devices: dict[str, RdmaDevice],
    declared: tuple[str, ...],
    netdevs: dict[str, NetdevInfo],
    configured: int | str = "auto",
) -> int:
    """The one GID index every declared device uses for RoCE v2 over IPv4 (UCX and Mooncake take one).

    `netdevs` maps each device's netdev name to its facts. With `configured` an int, that index is
    checked instead of searched. Raises RdmaError naming the device when there is no single answer.
    """
    indexes: dict[str, int] = {}
    for name in declared:
        dev = devices[name]
        nd = dev.netdevs[0] if dev.netdevs else None
        addrs = netdevs[nd].ipv4 if nd in netdevs else ()
        gids = roce_v2_gids(dev, nd, addrs)
        if isinstance(configured, int):
            if not any(g.index == configured for g in gids):
                port = dev.port(PORT)
                entry = next((g for g in port.gids if g.index == configured), None) if port else None
                what = f"{entry.type} {entry.gid}" if entry else "empty"
                raise RdmaError(
                    f"rdma.gid_index: {configured} on {name} port {PORT} is {what}, not a RoCE v2 IPv4 GID"
                    + (f" of {nd}" if nd else "")
                )
            indexes[name] = configured
            continue
        if not gids:
            where = f" for {nd}" + (f" ({', '.join(addrs)})" if addrs else " (no IPv4 address)") if nd else ""
            raise RdmaError(
                f"{name} port {PORT} has no RoCE v2 GID with an IPv4 address{where}; "
                "give the interface its IPv4 address, or set rdma.gid_index"
            )
        indexes[name] = gids[0].index
    values = set(indexes.values())
    if len(values) > 1:
        detail = ", ".join(f"{k}={v}" for k, v in sorted(indexes.items()))
        raise RdmaError(
            f"RoCE v2 GID index differs between devices ({detail}); UCX_IB_GID_INDEX and MC_GID_INDEX take "
            "one value: give every port the same address layout, or list fewer rdma_devices"
        )
    if not values:
        raise RdmaError("no rdma_devices declared for this host")
    return values.pop()


def ucx_net_devices(devices: tuple[str, ...]) -> str:
    """UCX_NET_DEVICES for the declared devices, `mlx5_0:1,mlx5_1:1` (UCX FAQ, RoCE section)."""
    return ",".join(f"{d}:{PORT}" for d in devices)


def pfc_vector(priority: int) -> list[int]:
    """PFC enable flags for priorities 0..7 with only `priority` on."""
    return [1 if i == priority else 0 for i in range(8)]


def qos_commands(tool: str, netdev: str, priority: int, dscp: int) -> tuple[str, ...]:
    """The commands that set trust dscp, PFC only on `priority` and DSCP `dscp` → `priority`."""
    n = shlex.quote(netdev)
    if tool == "mlnx_qos":
        pfc = ",".join(map(str, pfc_vector(priority)))
        return (
            f"mlnx_qos -i {n} --trust dscp",
            f"mlnx_qos -i {n} --pfc {pfc}",
            f"mlnx_qos -i {n} --dscp2prio set,{dscp},{priority}",
        )
    # dcb: an APP-table DSCP rule switches mlx5 to DSCP trust (dcb-app(8), mlx5 dcbnl).
    return (
        f"dcb pfc set dev {n} prio-pfc all:off {priority}:on",
        f"dcb app replace dev {n} dscp-prio {dscp}:{priority}",
    )


def qos_tool(tools: QosTools) -> str | None:
    """mlnx_qos where present (OFED/DOCA hosts), else iproute2's dcb."""
    if tools.mlnx_qos:
        return "mlnx_qos"
    if tools.dcb:
        return "dcb"
    return None


def qos_converged(state: QosState, priority: int, dscp: int) -> bool:
    """Trust is DSCP, PFC is on exactly `priority`, and `dscp` maps to it."""
    return (
        state.trust == "dscp"
        and state.pfc_only(priority)
        and (not state.dscp2prio or state.dscp2prio.get(dscp) == priority)
    )


def ecn_converged(info: NetdevInfo, priority: int) -> bool | None:
    """ECN (DCQCN) on for `priority` at both notification and reaction point; None if not mlx5."""
    if priority not in info.ecn_np or priority not in info.ecn_rp:
        return None
    return info.ecn_np[priority] and info.ecn_rp[priority]


def roce_script(
    devices: tuple[str, ...], netdevs: dict[str, str], rdma: RdmaSpec, tool: str | None, ecn_capable: bool
) -> str:
    """The boot-time script that (re)applies RoCE settings none of which survive a reboot by themselves.

    `netdevs` maps RDMA device → netdev. Run by pdfleet-roce.service (oneshot) at boot and when changed.
    """
    lines = [
        "#!/bin/sh",
        "# Written by pdfleet (rdma role): RoCE settings that do not persist across reboots.",
        "set -eu",
        "mountpoint -q /sys/kernel/config || mount -t configfs none /sys/kernel/config",
        "modprobe rdma_cm",
    ]
    for dev in devices:
        nd = netdevs.get(dev)
        d = shlex.quote(dev)
        if rdma.roce_v2:
            lines += [
                f"mkdir -p /sys/kernel/config/rdma_cm/{d}",
                f"echo '{ROCE_V2}' > /sys/kernel/config/rdma_cm/{d}/ports/{PORT}/default_roce_mode",
            ]
        if nd is None:
            continue
        n = shlex.quote(nd)
        lines.append(f"ip link set dev {n} mtu {int(rdma.mtu)}")
        if tool:
            lines += list(qos_commands(tool, nd, rdma.pfc_priority, rdma.dscp))
        if rdma.ecn and ecn_capable:
            p = int(rdma.pfc_priority)
            lines += [
                f"echo 1 > /sys/class/net/{n}/ecn/roce_np/enable/{p}",
                f"echo 1 > /sys/class/net/{n}/ecn/roce_rp/enable/{p}",
            ]
    return "\n".join(lines) + "\n"


def roce_unit() -> str:
    """pdfleet-roce.service: runs the RoCE script once at boot, after the NICs are up."""
    return (
        "[Unit]\n"
        "Description=pdfleet RoCE settings (RoCE v2 default, MTU, trust/PFC, ECN)\n"
        "After=network-online.target\n"
        "Wants=network-online.target\n\n"
        "[Service]\n"
        "Type=oneshot\n"
        "RemainAfterExit=yes\n"
        "ExecStart=/usr/local/sbin/pdfleet-roce-setup\n\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )

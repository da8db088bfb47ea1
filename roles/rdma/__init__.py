"""rdma: rdma-core and tools (the distribution's, unless DOCA-OFED is installed), RDMA kernel modules,
RoCE v2 as RDMA-CM default, MTU, trust DSCP, PFC, ECN.

Runtime RoCE settings do not survive a reboot, so they live in one script run by a oneshot unit
(pdfleet-roce.service) at boot; provision reruns it when the script changed or the NIC drifted.
Declared `rdma_devices` that don't exist, ports that aren't ACTIVE, or no RoCE v2 GID are errors
naming the device.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pdfleet.fleet.render import RenderedFile
from pdfleet.fleet.roles import ManagedUnit, RoleContext
from pdfleet.hw import HardwareError
from pdfleet.hw.rdma import (
    INBOX_PACKAGES,
    PORT,
    ROCE_V2,
    RdmaError,
    check_devices,
    compute_gid_index,
    ecn_converged,
    netdev_of,
    qos_converged,
    qos_tool,
    rdma_stack,
    roce_script,
    roce_unit,
)
from pdfleet.hw.rdma_facts import NetdevFact, NetdevInfo, QosFact, QosToolsFact, RdmaDevice, RdmaSysfsFact
from pdfleet.ops.apt import AptPackage, AptPackages
from pdfleet.ops.base import Change, Fact, FactSource, Operation, Skip
from pdfleet.ops.files import File
from pdfleet.ops.kernel import KernelModule
from pdfleet.ops.systemd import Service, SystemdUnit, restart_handler

NAME = "rdma"
APT_PACKAGES: tuple[str, ...] = INBOX_PACKAGES
MODULES = ("ib_uverbs", "rdma_ucm", "ib_umad")
SCRIPT = "/usr/local/sbin/pdfleet-roce-setup"
UNIT = "pdfleet-roce.service"
REAPPLY = restart_handler(UNIT)  # a oneshot with RemainAfterExit: restart reruns the script


def applies(ctx: RoleContext) -> bool:
    """Prefill/decode hosts of a cross-host model (same-host KV moves over PCIe/NVLink): the host's own P/D
    model's topology (ctx.kv_profile), which a `models:` entry may set apart from the profile's top level."""
    return any(i.kv_role for i in ctx.instances) and ctx.kv_profile.topology == "cross-host"


def facts(ctx: RoleContext) -> tuple[Fact[Any], ...]:
    """The devices always (said in the skip); installed packages and QoS tools once it configures them."""
    rdma = ctx.profile.rdma
    configures = rdma.enabled and ctx.host.rdma_devices
    return (RdmaSysfsFact(),) + ((AptPackages(), QosToolsFact()) if configures else ())


def files(ctx: RoleContext) -> list[RenderedFile]:
    return []  # the RoCE script depends on the NICs found (facts)


def units(ctx: RoleContext) -> list[ManagedUnit]:
    return []  # pdfleet-roce.service is a oneshot, not a long-running unit


@dataclass(frozen=True)
class Reapply(Operation):
    """Rerun the RoCE script because the NIC no longer matches it (MTU, QoS, ECN, RoCE mode drifted)."""

    drift: tuple[str, ...]

    def describe(self) -> str:
        return "RoCE settings"

    def plan(self, facts: FactSource) -> list[Change]:
        if not self.drift:
            return []
        return [Change(self.describe(), "\n".join(self.drift), (), (REAPPLY,))]


def drift(
    ctx: RoleContext,
    facts: FactSource,
    found: dict[str, RdmaDevice],
    netdevs: dict[str, NetdevInfo],
    tool: str | None,
) -> list[str]:
    """What differs on the host from the profile's RDMA settings right now."""
    rdma = ctx.profile.rdma
    out = []
    for dev in ctx.host.rdma_devices:
        port = found[dev].port(PORT)
        if rdma.roce_v2 and port is not None and port.default_roce_mode != ROCE_V2:
            out.append(f"{dev}: RDMA-CM default mode {port.default_roce_mode or 'unset'} → {ROCE_V2}")
    for name, info in netdevs.items():
        if info.mtu != rdma.mtu:
            out.append(f"{name}: MTU {info.mtu} → {rdma.mtu}")
        if tool and not qos_converged(facts.get(QosFact(name, tool)), rdma.pfc_priority, rdma.dscp):
            out.append(f"{name}: trust dscp, PFC only on priority {rdma.pfc_priority}, DSCP {rdma.dscp}")
        if rdma.ecn and ecn_converged(info, rdma.pfc_priority) is False:
            out.append(f"{name}: ECN on priority {rdma.pfc_priority}")
    return out


def operations(ctx: RoleContext, facts: FactSource) -> Iterable[Operation | Skip]:
    """Check the declared devices, install the stack, then persist and apply the RoCE settings."""
    rdma = ctx.profile.rdma
    declared = tuple(ctx.host.rdma_devices)
    found = facts.get(RdmaSysfsFact())
    if not rdma.enabled:
        yield Skip("RDMA", "rdma.enabled is false in the profile: KV moves over TCP")
        return
    if not declared:
        have = ", ".join(sorted(found)) or "none in /sys/class/infiniband"
        yield Skip("RDMA", f"the host declares no rdma_devices (RDMA devices found: {have})")
        return
    problems = check_devices(declared, found)
    if problems:
        raise HardwareError(f"{ctx.host.name}: " + "; ".join(problems))
    netdevs_by_dev = netdev_of(found, declared)
    netdevs = {nd: facts.get(NetdevFact(nd)) for nd in netdevs_by_dev.values()}
    if ctx.host.rdma_netdev and ctx.host.rdma_netdev not in netdevs:
        raise HardwareError(
            f"{ctx.host.name}: rdma_netdev {ctx.host.rdma_netdev} is not the netdev of any declared "
            f"rdma_devices ({', '.join(f'{d}→{n}' for d, n in netdevs_by_dev.items()) or 'none'})"
        )
    try:
        compute_gid_index(found, declared, netdevs, rdma.gid_index)
    except RdmaError as exc:
        raise HardwareError(f"{ctx.host.name}: {exc}") from None
    stack = rdma_stack(facts.get(AptPackages()))
    if stack.doca:
        yield Skip("inbox RDMA packages", stack.reason)
    else:
        for package in APT_PACKAGES:
            yield AptPackage(package)
    for module in MODULES:
        yield KernelModule(module, present=True, persist=True)
    tool = qos_tool(facts.get(QosToolsFact()))
    if tool is None:
        yield Skip("trust/PFC", "neither mlnx_qos nor dcb (iproute2) is installed")
    ecn_capable = all(ecn_converged(info, rdma.pfc_priority) is not None for info in netdevs.values())
    if rdma.ecn and not ecn_capable:
        yield Skip("ECN", "no mlx5 ECN switches under /sys/class/net/<netdev>/ecn on every port")
    script = roce_script(declared, netdevs_by_dev, rdma, tool, ecn_capable)
    yield File(SCRIPT, script, mode="0755", notify=(REAPPLY,))
    yield SystemdUnit(UNIT, roce_unit(), restart=REAPPLY)
    yield Service(UNIT, enabled=True, running=True)
    yield Reapply(tuple(drift(ctx, facts, found, netdevs, tool)))

"""RDMA host facts: devices, ports and GID tables from sysfs, netdevs, and NIC QoS.

Commands never fail on a host without RDMA hardware (or without the tool): they print what they
found, and the parsers turn "nothing" into an empty value, so the rdma role can skip with a reason.
Parsers are module-level functions so the tests can feed them fixture text directly.
`rdma` turns these facts into decisions.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field

from pdfleet.hw.sections import split_sections
from pdfleet.ops.base import Fact


@dataclass(frozen=True)
class Gid:
    """One non-zero entry of a port's GID table with its type and netdev."""

    index: int
    gid: str
    type: str  # "IB/RoCE v1" or "RoCE v2"
    ndev: str | None

    @property
    def ipv4(self) -> str | None:
        """The IPv4 address of an IPv4-mapped GID (::ffff:a.b.c.d), else None."""
        groups = self.gid.split(":")
        if len(groups) != 8 or any(int(g, 16) for g in groups[:5]) or groups[5].lower() != "ffff":
            return None
        hi, lo = int(groups[6], 16), int(groups[7], 16)
        return f"{hi >> 8}.{hi & 0xFF}.{lo >> 8}.{lo & 0xFF}"


@dataclass(frozen=True)
class RdmaPort:
    """One port of an RDMA device as sysfs (and configfs rdma_cm) shows it."""

    number: int
    state: str = ""  # e.g. "ACTIVE" (sysfs "4: ACTIVE")
    phys_state: str = ""
    link_layer: str = ""  # "Ethernet" (RoCE) or "InfiniBand"
    gids: tuple[Gid, ...] = ()
    default_roce_mode: str | None = None  # configfs rdma_cm, when the directory exists


@dataclass(frozen=True)
class RdmaDevice:
    """An RDMA device (e.g. mlx5_0), its netdevs and ports."""

    name: str
    netdevs: tuple[str, ...] = ()
    ports: tuple[RdmaPort, ...] = ()

    def port(self, number: int) -> RdmaPort | None:
        """The port with this number, None when the device has none."""
        return next((p for p in self.ports if p.number == number), None)


_SYSFS_LINE = re.compile(r"^(?P<dev>[^/]+)/ports/(?P<port>\d+)/(?P<rest>[^:]+):(?P<value>.*)$")
_ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


def parse_rdma_sysfs(stdout: str) -> dict[str, RdmaDevice]:
    """`grep -H .` over /sys/class/infiniband/*/ports/*/... (kernel ABI sysfs-class-infiniband),
    run from /sys/class/infiniband so lines read `mlx5_0/ports/1/gids/3:0000:...`."""
    sec = split_sections(stdout)
    ports: dict[tuple[str, int], dict[str, str]] = {}
    gids: dict[tuple[str, int], dict[int, dict[str, str]]] = {}
    for line in sec.get("ports", []):
        m = _SYSFS_LINE.match(line.strip())
        if not m:
            continue
        key = (m["dev"], int(m["port"]))
        rec = ports.setdefault(key, {})
        rest, value = m["rest"], m["value"].strip()
        if rest in ("state", "phys_state"):
            rec[rest] = value.split(":", 1)[-1].strip()
        elif rest == "link_layer":
            rec[rest] = value
        else:
            parts = rest.split("/")
            if parts[0] == "gids" and len(parts) == 2 and value != _ZERO_GID:
                gids.setdefault(key, {}).setdefault(int(parts[1]), {})["gid"] = value
            elif parts[:1] == ["gid_attrs"] and len(parts) == 3 and parts[1] in ("types", "ndevs"):
                gids.setdefault(key, {}).setdefault(int(parts[2]), {})[parts[1]] = value
    for line in sec.get("roce_mode", []):
        m = _SYSFS_LINE.match(line.strip().removeprefix("/sys/kernel/config/rdma_cm/"))
        if m and m["rest"] == "default_roce_mode":
            ports.setdefault((m["dev"], int(m["port"])), {})["roce_mode"] = m["value"].strip()
    netdevs: dict[str, tuple[str, ...]] = {}
    for line in sec.get("netdevs", []):
        parts = line.split()
        if parts:
            netdevs[parts[0]] = tuple(parts[1:])
    devices: dict[str, dict[int, RdmaPort]] = {}
    for (dev, num), rec in sorted(ports.items()):
        entries = tuple(
            Gid(i, g["gid"], g.get("types", ""), g.get("ndevs"))
            for i, g in sorted(gids.get((dev, num), {}).items())
            if "gid" in g
        )
        devices.setdefault(dev, {})[num] = RdmaPort(
            num,
            str(rec.get("state", "")),
            str(rec.get("phys_state", "")),
            str(rec.get("link_layer", "")),
            entries,
            rec.get("roce_mode"),
        )
    names = sorted(set(devices) | set(netdevs))
    return {n: RdmaDevice(n, netdevs.get(n, ()), tuple(devices.get(n, {}).values())) for n in names}


@dataclass(frozen=True)
class RdmaSysfsFact(Fact["dict[str, RdmaDevice]"]):
    """Every RDMA device with its ports, port state, link layer, GID table and netdevs, from sysfs."""

    def command(self) -> str:
        p = "*/ports/*"
        return (
            "cd /sys/class/infiniband 2>/dev/null || exit 0; echo '== ports'; "
            f"grep -Hs . {p}/state {p}/phys_state {p}/link_layer {p}/gids/* "
            f"{p}/gid_attrs/types/* {p}/gid_attrs/ndevs/* 2>/dev/null; "
            "echo '== netdevs'; for d in *; do "
            "echo \"$d $(ls \"$d/device/net\" 2>/dev/null | tr '\\n' ' ')\"; done; echo '== roce_mode'; "
            "grep -Hs . /sys/kernel/config/rdma_cm/*/ports/*/default_roce_mode 2>/dev/null; true"
        )

    def parse(self, stdout: str, rc: int) -> dict[str, RdmaDevice]:
        return parse_rdma_sysfs(stdout)


# ---------------------------------------------------------------- netdev, QoS


@dataclass(frozen=True)
class NetdevInfo:
    """A network interface's MTU, state, IPv4 addresses and mlx5 ECN switches (exists: False when absent)."""

    name: str
    exists: bool
    mtu: int | None = None
    operstate: str = ""
    ipv4: tuple[str, ...] = ()
    # priority -> enabled (mlx5 sysfs); dicts cannot be hashed, so they stay out of the hash
    ecn_np: dict[int, bool] = field(default_factory=dict, hash=False)
    ecn_rp: dict[int, bool] = field(default_factory=dict, hash=False)


def parse_netdev(name: str, stdout: str) -> NetdevInfo:
    """Sections: mtu, operstate (sysfs), `ip -j -4 addr show dev X` JSON, ECN enable files."""
    sec = split_sections(stdout)
    mtu_lines = [s.strip() for s in sec.get("mtu", []) if s.strip()]
    if not mtu_lines or not mtu_lines[0].isdigit():
        return NetdevInfo(name, False)
    addrs: list[str] = []
    try:
        data = json.loads("\n".join(sec.get("addr", [])) or "[]")
        for link in data:
            addrs += [a["local"] for a in link.get("addr_info", []) if a.get("family") == "inet"]
    except (ValueError, TypeError, KeyError):
        addrs = []
    ecn: dict[str, dict[int, bool]] = {"roce_np": {}, "roce_rp": {}}
    for line in sec.get("ecn", []):
        m = re.match(r"^.*/ecn/(roce_np|roce_rp)/enable/(\d+):(\d)$", line.strip())
        if m:
            ecn[m[1]][int(m[2])] = m[3] == "1"
    state = next((s.strip() for s in sec.get("operstate", []) if s.strip()), "")
    return NetdevInfo(name, True, int(mtu_lines[0]), state, tuple(addrs), ecn["roce_np"], ecn["roce_rp"])


@dataclass(frozen=True)
class NetdevFact(Fact[NetdevInfo]):
    """MTU, state, IPv4 addresses and mlx5 ECN switches of one network interface."""

    name: str

    def command(self) -> str:
        n = shlex.quote(self.name)
        return (
            f"echo '== mtu'; cat /sys/class/net/{n}/mtu 2>/dev/null; "
            f"echo '== operstate'; cat /sys/class/net/{n}/operstate 2>/dev/null; "
            f"echo '== addr'; ip -j -4 addr show dev {n} 2>/dev/null; "
            f"echo '== ecn'; grep -Hs . /sys/class/net/{n}/ecn/roce_np/enable/* "
            f"/sys/class/net/{n}/ecn/roce_rp/enable/* 2>/dev/null; true"
        )

    def parse(self, stdout: str, rc: int) -> NetdevInfo:
        return parse_netdev(self.name, stdout)


@dataclass(frozen=True)
class QosTools:
    """Which QoS tools are installed."""

    mlnx_qos: bool
    dcb: bool


@dataclass(frozen=True)
class QosToolsFact(Fact[QosTools]):
    """Which QoS tool the host has: mlnx_qos (MLNX/DOCA-OFED mlnx-tools) or iproute2's dcb."""

    def command(self) -> str:
        return (
            "command -v mlnx_qos >/dev/null 2>&1 && echo mlnx_qos; "
            "command -v dcb >/dev/null 2>&1 && echo dcb; true"
        )

    def parse(self, stdout: str, rc: int) -> QosTools:
        words = set(stdout.split())
        return QosTools("mlnx_qos" in words, "dcb" in words)


@dataclass(frozen=True)
class QosState:
    """What the NIC reports: trust mode, PFC per priority, DSCP→priority map (None = not readable)."""

    trust: str | None
    pfc: tuple[bool, ...] | None  # index = priority 0..7
    dscp2prio: dict[int, int] = field(default_factory=dict, hash=False)  # a dict: kept out of the hash

    def pfc_only(self, priority: int) -> bool:
        """PFC enabled on exactly this priority."""
        return self.pfc is not None and all(on == (i == priority) for i, on in enumerate(self.pfc))


def parse_mlnx_qos(stdout: str) -> QosState:
    """`mlnx_qos -i IF` (mlnx-tools; format as in NVIDIA's mlnx_qos doc): trust line, PFC table."""
    trust = None
    pfc = None
    dscp: dict[int, int] = {}
    lines = stdout.splitlines()
    for i, raw in enumerate(lines):
        line = raw.strip()
        m = re.match(r"^Priority trust state:\s*(\w+)", line, re.I)
        if m:
            trust = m[1].lower()
        m = re.match(r"^prio:(\d)\s+dscp:([\d,]+)", line)
        if m:
            for v in m[2].split(","):
                if v.strip():
                    dscp[int(v)] = int(m[1])
        if line.startswith("enabled") and i > 0 and lines[i - 1].strip().startswith("priority"):
            vals = line.split()[1:]
            if len(vals) == 8:
                pfc = tuple(v == "1" for v in vals)
    return QosState(trust, pfc, dscp)


def parse_dcb(stdout: str) -> QosState:
    """`dcb pfc show dev IF` and `dcb -N app show dev IF dscp-prio` (iproute2 dcb-pfc(8), dcb-app(8)).
    mlx5 switches to DSCP trust when the APP table holds a DSCP rule, so trust is inferred from it."""
    pfc = None
    dscp: dict[int, int] = {}
    for raw in stdout.splitlines():
        line = raw.strip()
        if line.startswith("prio-pfc"):
            vals = dict(tok.split(":") for tok in line.split()[1:] if ":" in tok)
            if all(str(i) in vals for i in range(8)):
                pfc = tuple(vals[str(i)] == "on" for i in range(8))
        elif line.startswith("dscp-prio"):
            for tok in line.split()[1:]:
                k, _, v = tok.partition(":")
                if k.isdigit() and v.isdigit():
                    dscp[int(k)] = int(v)
    return QosState("dscp" if dscp else None, pfc, dscp)


@dataclass(frozen=True)
class QosFact(Fact[QosState]):
    """Current QoS of a netdev, read with the given tool ("mlnx_qos" or "dcb")."""

    netdev: str
    tool: str

    sudo = True

    def command(self) -> str:
        n = shlex.quote(self.netdev)
        if self.tool == "mlnx_qos":
            return f"mlnx_qos -i {n} 2>/dev/null; true"
        return f"dcb pfc show dev {n} 2>/dev/null; dcb -N app show dev {n} dscp-prio 2>/dev/null; true"

    def parse(self, stdout: str, rc: int) -> QosState:
        return parse_mlnx_qos(stdout) if self.tool == "mlnx_qos" else parse_dcb(stdout)

"""The fleet view's gatherer: what each pool instance runs (its unit's --kv-transfer-config, the release it
reports), TCP connects to the side channel run ON each decode host, GPU P2P on same-host pairs, the RDMA
facts of cross-host hosts, and the metrics figures per role through the one `MetricsSource`.

Everything here only reads; the decisions are in `fleet_rules` and `metrics_rules`.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx2

from pdfleet.errors import PdfleetError
from pdfleet.fleet.topology import Instance, Topology
from pdfleet.hw.rdma import netdev_of, qos_tool
from pdfleet.hw.rdma_facts import (
    NetdevFact,
    NetdevInfo,
    QosFact,
    QosState,
    QosToolsFact,
    RdmaDevice,
    RdmaSysfsFact,
)
from pdfleet.model.connectors import MOONCAKE
from pdfleet.model.inventory import Host
from pdfleet.model.profile import Profile
from pdfleet.model.vllm_release_data import RELEASES
from pdfleet.model.vllm_releases import Release, find_release
from pdfleet.ops.gather import HostFacts
from pdfleet.ops.ssh import Transport

CONNECT_TIMEOUT_S = 3
P2P_COMMAND = "nvidia-smi topo -p2p r"
Connector = Callable[[Host], Transport]  # a host -> an open transport (SSH in the CLI)


@dataclass(frozen=True)
class InstanceFacts:
    """What one pool instance runs: its unit file's KV settings and the vLLM release it reports."""

    instance: Instance
    connector: str | None = None  # kv_connector of the unit's --kv-transfer-config
    kv_role: str | None = None
    release: str | None = None  # /version's answer, or the simulator's --sim-vllm-version
    problem: str | None = None  # why the unit or the release could not be read


@dataclass(frozen=True)
class Connect:
    """A TCP connect run on `from_host` to a prefill instance's side-channel (or bootstrap) port."""

    from_host: str
    to_host: str
    address: str
    port: int
    purpose: str  # "NIXL side channel" / "Mooncake bootstrap"
    command: str
    rc: int
    output: str

    @property
    def open(self) -> bool:
        return self.rc == 0


@dataclass(frozen=True)
class RdmaHostFacts:
    """A cross-host pool host's RDMA facts, as the rdma role reads them."""

    host: Host
    devices: Mapping[str, RdmaDevice]
    netdevs: Mapping[str, NetdevInfo]
    qos: Mapping[str, QosState] = field(default_factory=dict)  # netdev -> trust/PFC (when a tool exists)


@dataclass(frozen=True)
class RoleFigures:
    """Metric figures of one role (prefill, decode, colocated) over the window; None: not read."""

    role: str
    queue_p95_s: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None  # mean over the role's instances, 0..1
    preemptions_per_min: float | None = None
    missing: tuple[str, ...] = ()  # what could not be read, and why


@dataclass(frozen=True)
class FleetFacts:
    """Everything the fleet rules read."""

    profile: Profile
    topology: Topology
    instances: tuple[InstanceFacts, ...] = ()
    connects: tuple[Connect, ...] = ()
    p2p: Mapping[str, Mapping[tuple[int, int], str] | str] = field(
        default_factory=dict
    )  # host -> matrix | why not
    rdma: tuple[RdmaHostFacts, ...] = ()
    figures: Mapping[str, RoleFigures] = field(default_factory=dict)
    metrics_source: str = ""
    unreachable: Mapping[str, str] = field(default_factory=dict)  # host -> why SSH failed


def parse_unit(text: str) -> tuple[str | None, str | None, str | None]:
    """(kv_connector, kv_role, --sim-vllm-version) from a rendered vLLM unit's ExecStart line."""
    line = next((ln for ln in text.splitlines() if ln.startswith("ExecStart=")), "")
    try:
        argv = shlex.split(line.removeprefix("ExecStart="))
    except ValueError:
        return None, None, None
    opts = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
    try:
        kv: Any = json.loads(opts.get("--kv-transfer-config", "{}"))
    except ValueError:
        kv = {}
    kv = kv if isinstance(kv, dict) else {}
    return kv.get("kv_connector"), kv.get("kv_role"), opts.get("--sim-vllm-version")


def parse_version(body: str) -> str | None:
    """The release of a vLLM /version answer ({"version": "0.11.0"}); None for anything else."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    version = data.get("version") if isinstance(data, dict) else None
    return version if isinstance(version, str) and re.match(r"^\d+\.\d+", version) else None


def parse_p2p(stdout: str) -> dict[tuple[int, int], str]:
    """`nvidia-smi topo -p2p r`'s matrix: (GPU i, GPU j) -> OK / CNS / GNS / TNS / NS / U (X: itself)."""
    rows = [ln.split() for ln in stdout.splitlines() if ln.strip().startswith("GPU")]
    if not rows:
        return {}
    header = [int(c[3:]) for c in rows[0] if c.startswith("GPU")]
    out = {}
    for row in rows[1:]:
        if not row or not row[0].startswith("GPU"):
            continue
        i = int(row[0][3:])
        for j, status in zip(header, row[1:], strict=False):
            out[(i, j)] = status
    return out


def connect_command(address: str, port: int) -> str:
    """A TCP connect with bash's /dev/tcp, bounded by `timeout`: rc 0 open, 1 refused, 124 timed out."""
    inner = f"exec 3<>/dev/tcp/{address}/{port}"
    return f"timeout {CONNECT_TIMEOUT_S} bash -c {shlex.quote(inner)}"


def side_channel_targets(
    profile: Profile, topology: Topology, release: Release | None
) -> list[tuple[Instance, int, str]]:
    """Every (prefill instance, port, purpose) a decode instance must reach: NIXL's side-channel ports (one
    per TP rank where the release says so) or Mooncake's bootstrap port."""
    out = []
    spec = profile.pools.prefill
    tp = spec.tensor_parallel_size if spec else 1
    for inst in topology.pool("prefill"):
        if profile.kv_transfer.connector == MOONCAKE and inst.bootstrap_port:
            out.append((inst, inst.bootstrap_port, "Mooncake bootstrap"))
        elif inst.side_channel_port is not None:
            ports = (
                release.side_channel_ports(inst.side_channel_port, tp)
                if release
                else (inst.side_channel_port,)
            )
            out += [(inst, p, "NIXL side channel") for p in ports]
    return out


def gather_instances(
    topology: Topology, hosts: Mapping[str, Transport], timeout: float
) -> list[InstanceFacts]:
    """Each instance's unit (read on its host) and /version (asked over HTTP)."""
    out = []
    with httpx2.Client(timeout=timeout, trust_env=False) as http:
        for inst in topology.instances:
            transport = hosts.get(inst.host)
            if transport is None:
                out.append(InstanceFacts(inst, problem=f"{inst.host} not reachable over SSH"))
                continue
            res = transport.run(f"cat {shlex.quote(inst.unit_path)}", timeout=timeout)
            if res.rc != 0:
                out.append(
                    InstanceFacts(inst, problem=f"{inst.unit_path}: {(res.stderr or res.stdout).strip()}")
                )
                continue
            connector, role, sim_version = parse_unit(res.stdout)
            try:
                release = parse_version(http.get(inst.url + "/version").text) or sim_version
            except httpx2.HTTPError as exc:
                out.append(InstanceFacts(inst, connector, role, sim_version, f"{inst.url}/version: {exc}"))
                continue
            out.append(InstanceFacts(inst, connector, role, release))
    return out


def gather_connects(profile: Profile, topology: Topology, hosts: Mapping[str, Transport]) -> list[Connect]:
    """From every decode host, a TCP connect to every prefill side-channel (or bootstrap) port."""
    release = find_release(profile.vllm.version, RELEASES)
    out = []
    decode_hosts = sorted({i.host for i in topology.pool("decode")})
    for host in decode_hosts:
        transport = hosts.get(host)
        if transport is None:
            continue
        for inst, port, purpose in side_channel_targets(profile, topology, release):
            address = inst.side_channel_host or inst.address
            cmd = connect_command(address, port)
            res = transport.run(cmd, timeout=CONNECT_TIMEOUT_S + 10)
            text = (res.stdout + res.stderr).strip() or ("connected" if res.rc == 0 else "")
            if res.rc == 124:
                text = (text + f" (no answer within {CONNECT_TIMEOUT_S} s: dropped)").strip()
            out.append(Connect(host, inst.host, address, port, purpose, cmd, res.rc, text))
    return out


def gather_p2p(
    topology: Topology, hosts: Mapping[str, Transport]
) -> dict[str, Mapping[tuple[int, int], str] | str]:
    """The P2P matrix of each host that runs both a prefill and a decode instance (or why there is none)."""
    out: dict[str, Mapping[tuple[int, int], str] | str] = {}
    for host in sorted(
        {i.host for i in topology.pool("prefill")} & {i.host for i in topology.pool("decode")}
    ):
        transport = hosts.get(host)
        if transport is None:
            continue
        res = transport.run(P2P_COMMAND, timeout=30)
        matrix = parse_p2p(res.stdout) if res.rc == 0 else {}
        out[host] = (
            matrix
            or f"`{P2P_COMMAND}` gave no matrix (rc {res.rc}): {(res.stderr or res.stdout).strip()[:200]}"
        )
    return out


def gather_rdma(
    profile: Profile, hosts: Mapping[str, Transport], inventory_hosts: Mapping[str, Host], topology: Topology
) -> list[RdmaHostFacts]:
    """The RDMA facts of each disaggregated pool host that declares rdma_devices (cross-host, RDMA on)."""
    if profile.topology != "cross-host" or not profile.rdma.enabled:
        return []
    out = []
    for name in sorted({i.host for i in topology.instances if i.pool in ("prefill", "decode")}):
        host, transport = inventory_hosts.get(name), hosts.get(name)
        if host is None or transport is None or not host.rdma_devices:
            continue
        facts = HostFacts(transport)
        devices = facts.get(RdmaSysfsFact())
        netdevs = {
            nd: facts.get(NetdevFact(nd)) for nd in netdev_of(devices, tuple(host.rdma_devices)).values()
        }
        tool = qos_tool(facts.get(QosToolsFact()))
        qos = {nd: facts.get(QosFact(nd, tool)) for nd in netdevs} if tool else {}
        out.append(RdmaHostFacts(host, devices, netdevs, qos))
    return out


def connect_hosts(
    names: list[str], inventory_hosts: Mapping[str, Host], connect: Connector
) -> tuple[dict[str, Transport], dict[str, str]]:
    """Open a transport to each host; the hosts that failed, with why (one host down never stops the rest)."""
    opened, failed = {}, {}
    for name in names:
        try:
            opened[name] = connect(inventory_hosts[name])
        except PdfleetError as exc:
            failed[name] = str(exc)
    return opened, failed

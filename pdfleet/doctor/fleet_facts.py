"""The fleet view's gatherer: what each pool instance runs (its unit's --kv-transfer-config, the release it
reports, and the unit-health fact saying why an instance does not answer), TCP connects to the side channel
run ON each decode host, GPU P2P on same-host pairs, the RDMA facts of cross-host hosts, what each pool host
runs (provision's OS fact and its CUDA repository line), and the metrics figures per model and role through
the one `MetricsSource`.

Everything here only reads; the decisions are in `fleet_rules` and `metrics_rules`.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx2

from pdfleet.errors import PdfleetError
from pdfleet.fleet.host_layout import MODELS_DIR
from pdfleet.fleet.roles import host_kv_profile
from pdfleet.fleet.topology import Instance, Topology
from pdfleet.fleet.weights import staged_dir
from pdfleet.hw.distro import CUDA_SOURCE
from pdfleet.hw.gpu_facts import NvidiaPciFact
from pdfleet.hw.os_facts import OsRelease, OsReleaseFact
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
from pdfleet.model.weights import WeightsManifest
from pdfleet.ops.base import Fact, FactSource
from pdfleet.ops.errors import FactError
from pdfleet.ops.files import FileContent
from pdfleet.ops.ssh import Transport
from pdfleet.ops.unit_health import UnitHealth
from pdfleet.ops.weights import StagedListing

T = TypeVar("T")
CONNECT_TIMEOUT_S = 3
P2P_COMMAND = "nvidia-smi topo -p2p r"
NO_GPU = "no NVIDIA GPU on the PCI bus"  # as hw.gpu.plan_gpu and verify say it
HostConnect = Callable[[Host], Transport]  # a host -> an open transport (SSH in the CLI)


@dataclass(frozen=True)
class InstanceFacts:
    """What one pool instance runs: its unit file's KV settings and the vLLM release it reports."""

    instance: Instance
    connector: str | None = None  # kv_connector of the unit's --kv-transfer-config
    kv_role: str | None = None
    release: str | None = None  # /version's answer, or the simulator's --sim-vllm-version
    problem: str | None = None  # why the unit or the release could not be read
    revision: str | None = None  # the model revision its unit serves (--revision, or its staged directory)
    files: Mapping[str, str] | None = None  # a staged model's files on its host: path -> sha256


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
class HostPlatform:
    """What a pool host runs (the OS fact provision reads), whether it has NVIDIA GPUs, and the CUDA
    repository line provision wrote there ("" when none)."""

    host: str
    os: OsRelease
    gpus: bool
    cuda_list: str


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
    # each served model's figures (by its name) per role: a `models:` profile's of its own instances
    figures: Mapping[str, Mapping[str, RoleFigures]] = field(default_factory=dict)
    metrics_source: str = ""
    unreachable: Mapping[str, str] = field(default_factory=dict)  # host -> why SSH failed
    platforms: tuple[HostPlatform, ...] = ()
    manifests: Mapping[str, WeightsManifest] = field(default_factory=dict)  # staged models' by model id


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


def unit_revision(text: str) -> str | None:
    """The revision a rendered vLLM unit serves: its --revision, or the revision directory it loads from
    (a staged model: MODELS_DIR/<id>/<revision>); None when it floats."""
    line = next((ln for ln in text.splitlines() if ln.startswith("ExecStart=")), "")
    try:
        argv = shlex.split(line.removeprefix("ExecStart="))
    except ValueError:
        return None
    if "--revision" in argv[:-1]:
        return argv[argv.index("--revision") + 1]
    model = argv[2] if len(argv) > 2 and argv[1] == "serve" else ""
    return model.rsplit("/", 1)[-1] if model.startswith(MODELS_DIR + "/") else None


def staged_directory(profile: Profile, inst: Instance) -> str | None:
    """The staged directory of the instance's model, None when the model is not staged."""
    model = profile.served_model(inst.model).model
    return staged_dir(model) if model.staged else None


def reported_release(body: str) -> str | None:
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
    """Every (prefill instance, port, purpose) a decode instance of its model must reach, by that model's
    connector: NIXL's side-channel ports (one per TP rank of its prefill pool where the release says so)
    or Mooncake's bootstrap port."""
    out = []
    for inst in topology.pool("prefill"):
        model = profile.served_model(inst.model or None)  # a topology built by hand may not name it
        spec = model.pools.prefill
        tp = spec.tensor_parallel_size if spec else 1
        if model.kv_transfer.connector == MOONCAKE and inst.bootstrap_port:
            out.append((inst, inst.bootstrap_port, "Mooncake bootstrap"))
        elif inst.side_channel_port is not None:
            ports = (
                release.side_channel_ports(inst.side_channel_port, tp)
                if release
                else (inst.side_channel_port,)
            )
            out += [(inst, p, "NIXL side channel") for p in ports]
    return out


@dataclass(frozen=True)
class TcpConnect(Fact["tuple[int, str]"]):
    """A TCP connect from the host to address:port: (rc, what bash said). rc 0 open, 124 no answer."""

    address: str
    port: int

    def command(self) -> str:
        return connect_command(self.address, self.port) + " 2>&1"

    def parse(self, stdout: str, rc: int) -> tuple[int, str]:
        return rc, stdout.strip()


@dataclass(frozen=True)
class P2pMatrix(Fact["Mapping[tuple[int, int], str] | str"]):
    """The host's GPU P2P matrix, or why there is none (no nvidia-smi: no NVIDIA GPU)."""

    def command(self) -> str:
        return f"{P2P_COMMAND} 2>&1"

    def parse(self, stdout: str, rc: int) -> Mapping[tuple[int, int], str] | str:
        matrix = parse_p2p(stdout) if rc == 0 else {}
        return matrix or f"`{P2P_COMMAND}` gave no matrix (rc {rc}): {stdout.strip()[:200]}"


def pair_hosts(profile: Profile, topology: Topology) -> list[str]:
    """Hosts that run both a prefill and a decode instance of a same-host model (a same-host pair)."""
    out: set[str] = set()
    for spec in profile.served:
        if spec.topology == "same-host":
            label = spec.name if spec.listed else None
            pre, dec = topology.pool("prefill", label), topology.pool("decode", label)
            out |= {i.host for i in pre} & {i.host for i in dec}
    return sorted(out)


def connects_planned(
    profile: Profile, topology: Topology
) -> dict[str, list[tuple[Instance, int, str, TcpConnect]]]:
    """Per decode host: every (prefill instance, port, purpose, connect fact) it must manage: those of the
    models it decodes for."""
    release = find_release(profile.vllm.version, RELEASES)
    targets = side_channel_targets(profile, topology, release)
    decodes: dict[str, set[str]] = {}
    for inst in topology.pool("decode"):
        decodes.setdefault(inst.host, set()).add(inst.model)
    return {
        host: [
            (inst, port, what, TcpConnect(inst.side_channel_host or inst.address, port))
            for inst, port, what in targets
            if inst.model in decodes[host]
        ]
        for host in sorted(decodes)
    }


def facts_to_gather(profile: Profile, topology: Topology) -> dict[str, list[Fact[Any]]]:
    """Per host, every fact the fleet rules read from it, so that each host answers in one batch."""
    plan: dict[str, list[Fact[Any]]] = {}
    for inst in topology.instances:
        plan.setdefault(inst.host, []).extend((FileContent(inst.unit_path), UnitHealth(inst.unit)))
        if (directory := staged_directory(profile, inst)) is not None:
            plan[inst.host].append(StagedListing(directory))
    for host, connects in connects_planned(profile, topology).items():
        plan.setdefault(host, []).extend(c[3] for c in connects)
    for host in pair_hosts(profile, topology):
        plan.setdefault(host, []).extend((NvidiaPciFact(), P2pMatrix()))
    for host in {i.host for i in topology.instances}:
        plan.setdefault(host, []).extend((OsReleaseFact(), NvidiaPciFact(), FileContent(CUDA_SOURCE)))
    return {host: list(dict.fromkeys(facts)) for host, facts in plan.items()}


def _get(facts: FactSource, fact: Fact[T]) -> tuple[T | None, str | None]:
    """A fact's value, or why it could not be read."""
    try:
        return facts.get(fact), None
    except (FactError, PdfleetError) as exc:
        return None, str(exc)


def unit_note(facts: FactSource, inst: Instance) -> str:
    """What the unit-health fact says of an instance's unit, to say why its /version did not answer (its
    state only: /version was just asked over HTTP, and a probe would only stretch the metrics window)."""
    state, _ = _get(facts, UnitHealth(inst.unit))
    return f" ({inst.unit} {state.active_state})" if state is not None else ""


def read_instances(
    topology: Topology, hosts: Mapping[str, FactSource], timeout: float, profile: Profile | None = None
) -> list[InstanceFacts]:
    """Each instance's unit (read on its host), the revision it serves and (a staged model, with the
    profile) the files of its staged directory, and /version (asked over HTTP, once the unit is read)."""
    out = []
    with httpx2.Client(timeout=timeout, trust_env=False) as http:
        for inst in topology.instances:
            facts = hosts.get(inst.host)
            if facts is None:
                out.append(InstanceFacts(inst, problem=f"{inst.host} not reachable over SSH"))
                continue
            text, why = _get(facts, FileContent(inst.unit_path))
            if text is None:
                out.append(InstanceFacts(inst, problem=f"{inst.unit_path}: {why or 'no such unit file'}"))
                continue
            connector, role, sim_version = parse_unit(text)
            revision = unit_revision(text)
            directory = staged_directory(profile, inst) if profile is not None else None
            files = _get(facts, StagedListing(directory))[0] if directory is not None else None
            try:
                release = reported_release(http.get(inst.url + "/version").text) or sim_version
            except httpx2.HTTPError as exc:
                problem = f"{inst.url}/version: {exc}{unit_note(facts, inst)}"
                out.append(InstanceFacts(inst, connector, role, sim_version, problem, revision, files))
                continue
            out.append(InstanceFacts(inst, connector, role, release, None, revision, files))
    return out


def read_connects(profile: Profile, topology: Topology, hosts: Mapping[str, FactSource]) -> list[Connect]:
    """The connects each decode host made to every prefill side-channel (or bootstrap) port."""
    out = []
    for host, planned in connects_planned(profile, topology).items():
        facts = hosts.get(host)
        if facts is None:
            continue
        for inst, port, purpose, fact in planned:
            value, why = _get(facts, fact)
            rc, text = value if value is not None else (-1, why or "")
            text = text or ("connected" if rc == 0 else "")
            if rc == 124:
                text = (text + f" (no answer within {CONNECT_TIMEOUT_S} s: dropped)").strip()
            out.append(
                Connect(
                    host,
                    inst.host,
                    fact.address,
                    port,
                    purpose,
                    connect_command(fact.address, port),
                    rc,
                    text,
                )
            )
    return out


def read_p2p(
    profile: Profile, topology: Topology, hosts: Mapping[str, FactSource]
) -> dict[str, Mapping[tuple[int, int], str] | str]:
    """The P2P matrix of each same-host pair's host (or why there is none)."""
    out: dict[str, Mapping[tuple[int, int], str] | str] = {}
    for host in pair_hosts(profile, topology):
        if host not in hosts:
            continue
        pci, _ = _get(hosts[host], NvidiaPciFact())
        if pci is not None and not pci.gpus:  # the gpu_driver role's and verify's own reading of the bus
            out[host] = NO_GPU
            continue
        value, why = _get(hosts[host], P2pMatrix())
        out[host] = value if value is not None else f"`{P2P_COMMAND}`: {why}"
    return out


def read_platforms(topology: Topology, hosts: Mapping[str, FactSource]) -> list[HostPlatform]:
    """What each reachable pool host runs (a host whose OS fact could not be read is left out)."""
    out = []
    for name in sorted({i.host for i in topology.instances} & set(hosts)):
        os, _ = _get(hosts[name], OsReleaseFact())
        pci, _ = _get(hosts[name], NvidiaPciFact())
        listed, _ = _get(hosts[name], FileContent(CUDA_SOURCE))
        if os is not None:
            out.append(HostPlatform(name, os, bool(pci and pci.gpus), listed or ""))
    return out


def read_rdma(
    profile: Profile, hosts: Mapping[str, FactSource], inventory_hosts: Mapping[str, Host], topology: Topology
) -> list[RdmaHostFacts]:
    """The RDMA facts of each disaggregated pool host that declares rdma_devices (RDMA on, the host's P/D
    model cross-host: fleet.roles.host_kv_profile, as the roles install it)."""
    if not profile.rdma.enabled:
        return []
    out = []
    for name in sorted({i.host for i in topology.instances if i.pool in ("prefill", "decode")}):
        host, facts = inventory_hosts.get(name), hosts.get(name)
        if host is None or facts is None or not host.rdma_devices:
            continue
        if host_kv_profile(profile, topology.on_host(name)).topology != "cross-host":
            continue
        devices = facts.get(RdmaSysfsFact())
        netdevs = {
            nd: facts.get(NetdevFact(nd)) for nd in netdev_of(devices, tuple(host.rdma_devices)).values()
        }
        tool = qos_tool(facts.get(QosToolsFact()))
        qos = {nd: facts.get(QosFact(nd, tool)) for nd in netdevs} if tool else {}
        out.append(RdmaHostFacts(host, devices, netdevs, qos))
    return out


def connect_hosts(
    names: list[str], inventory_hosts: Mapping[str, Host], connect: HostConnect
) -> tuple[dict[str, Transport], dict[str, str]]:
    """Open a transport to each host; the hosts that failed, with why (one host down never stops the rest)."""
    opened, failed = {}, {}
    for name in names:
        try:
            opened[name] = connect(inventory_hosts[name])
        except PdfleetError as exc:
            failed[name] = str(exc)
    return opened, failed

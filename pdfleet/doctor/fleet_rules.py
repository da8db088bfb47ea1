"""KV-transfer timeout causes, as pure rules over `FleetFacts`: prefill and decode on different connectors or
releases, the side channel not reachable from a decode host, no GPU P2P on a same-host pair, RoCE wrong;
prefill and decode serving different model revisions or files (issue 31); and a pool host's platform as
provision decides it (unsupported, branch missing, repository drifted).

The RoCE rule reuses the rdma role's own decisions (`pdfleet.hw.rdma`), so doctor and provision agree on
what "configured" means.
"""

from __future__ import annotations

from collections.abc import Mapping

from pdfleet.doctor.finding import Finding, profile_fix
from pdfleet.doctor.fleet_facts import FleetFacts, InstanceFacts, RdmaHostFacts
from pdfleet.hw.distro import PlatformRefusal, check_branch, repository_drift, resolve_platform
from pdfleet.hw.gpu import driver_branch
from pdfleet.hw.rdma import RdmaError, check_devices, compute_gid_index, qos_converged
from pdfleet.model.served import ServedModel

P2P_OK = "OK"
P2P_MEANING = {
    "CNS": "chipset not supported",
    "GNS": "GPU not supported",
    "TNS": "topology not supported",
    "NS": "not supported",
    "U": "unknown",
}


def rule_unreachable_hosts(facts: FleetFacts) -> list[Finding]:
    """Hosts SSH could not reach: their rules could not run."""
    return [
        Finding(
            "fleet.ssh",
            "error",
            f"{host} is not reachable over SSH: its checks did not run",
            why,
            "check the host is up and `invoke verify --profile P --limit HOST` connects",
            subject=host,
        )
        for host, why in sorted(facts.unreachable.items())
    ]


def rule_instances_unread(facts: FleetFacts) -> list[Finding]:
    """Instances whose unit or release could not be read: the connector and release rules skip them."""
    unread = [
        i for i in facts.instances if i.problem is not None and i.instance.host not in facts.unreachable
    ]
    if not unread:
        return []
    return [
        Finding(
            "fleet.instance_unread",
            "warning",
            f"{len(unread)} pool instance(s) could not be read: "
            "their connector and release were not compared",
            "\n".join(f"{i.instance.pool}@{i.instance.host}: {i.problem}" for i in unread),
            "provision the hosts (invoke provision --profile P), or check the units exist",
            subject=", ".join(sorted({i.instance.host for i in unread})),
        )
    ]


def rule_connector_mismatch(facts: FleetFacts) -> list[Finding]:
    """A P/D model's prefill and decode run different kv_connectors (or not its own, or a role that cannot
    pair); each model against its own connector (two models may use two)."""
    out = []
    pd = [i for i in facts.instances if i.instance.pool in ("prefill", "decode") and i.problem is None]
    for name in dict.fromkeys(i.instance.model for i in pd):
        spec = facts.profile.served_model(name or None)  # a topology built by hand may not name it
        out += _connectors(spec, [i for i in pd if i.instance.model == name])
    allowed = {"prefill": ("kv_producer", "kv_both"), "decode": ("kv_consumer", "kv_both")}
    for i in pd:
        if i.kv_role not in allowed[i.instance.pool]:
            out.append(
                Finding(
                    "kv.role",
                    "error",
                    f"the {i.instance.pool} instance on {i.instance.host} runs kv_role {i.kv_role}",
                    f"{i.instance.unit_path}: kv_role={i.kv_role}",
                    f"pools.{i.instance.pool}.kv_role: {allowed[i.instance.pool][0]}, then provision",
                    subject=i.instance.host,
                )
            )
    return out


def _connectors(spec: ServedModel, pd: list[InstanceFacts]) -> list[Finding]:
    """One model's P/D instances against each other and its kv_transfer.connector."""
    want, key = spec.kv_transfer.connector, spec.key("kv_transfer.connector")
    found = {f"{i.instance.pool}@{i.instance.host}": i.connector for i in pd}
    evidence = "\n".join(f"{k}: --kv-transfer-config kv_connector={v}" for k, v in sorted(found.items()))
    if len({c for c in found.values()}) > 1:
        return [
            Finding(
                "kv.connector_mismatch",
                "error",
                "prefill and decode instances run different kv_connectors: KV transfers time out",
                evidence,
                f"re-provision every pool host so all run {key} {want}: "
                "invoke provision --profile P --roles services",
                subject=key,
            )
        ]
    if found and set(found.values()) != {want}:
        return [
            Finding(
                "kv.connector_drift",
                "error",
                f"the pool instances run kv_connector {next(iter(found.values()))}, the profile says {want}",
                evidence,
                "invoke provision --profile P --roles services (the hosts run another profile's units)",
                subject=key,
            )
        ]
    return []


def rule_release_mismatch(facts: FleetFacts) -> list[Finding]:
    """Prefill and decode report different vLLM releases (the handshake and kv_transfer_params differ), or a
    release other than the pin."""
    pin = facts.profile.vllm.version
    pd = [i for i in facts.instances if i.instance.pool in ("prefill", "decode") and i.release]
    evidence = "\n".join(f"{i.instance.pool}@{i.instance.host}: vLLM {i.release}" for i in pd)
    releases = {i.release for i in pd}
    if len(releases) > 1:
        return [
            Finding(
                "kv.release_mismatch",
                "error",
                "prefill and decode run different vLLM releases: their "
                "KV-transfer handshake and kv_transfer_params differ",
                evidence,
                f"pin one release (vllm.version: {pin}) and re-provision both pools",
                subject="vllm.version",
            )
        ]
    if releases and releases != {pin}:
        return [
            Finding(
                "kv.release_drift",
                "warning",
                f"the pools run vLLM {releases.pop()}, the profile pins {pin}",
                evidence,
                "invoke provision --profile P (installs the pinned release)",
                subject="vllm.version",
            )
        ]
    return []


def _connect_failure(rc: int, output: str) -> str:
    """How a connect failed, from bash's message and timeout's status."""
    text = output.lower()
    if rc == 124:
        return "dropped (no answer: a firewall drops it)"
    if "refused" in text:
        return "refused (nothing listens there, or a firewall rejects it)"
    if any(w in text for w in ("permission denied", "prohibited", "unreachable")):
        return "blocked on the way (a firewall or routing rule)"
    return f"failed (rc {rc})"


def rule_side_channel(facts: FleetFacts) -> list[Finding]:
    """A decode host cannot open the prefill side channel (or Mooncake bootstrap) port: the handshake fails
    and every transfer from that prefill instance times out."""
    out = []
    for c in facts.connects:
        if c.open:
            continue
        how = _connect_failure(c.rc, c.output)
        out.append(
            Finding(
                "kv.side_channel",
                "error",
                f"{c.from_host} (decode) cannot reach the {c.purpose} of {c.to_host} at "
                f"{c.address}:{c.port}: {how}",
                f"on {c.from_host}: {c.command}\nrc={c.rc} {c.output}",
                f"allow TCP {c.port} from {c.from_host} to {c.to_host} (nft list ruleset / iptables -S on "
                f"both hosts); if the port is taken, move kv_transfer.side_channel_port",
                subject=f"{c.from_host}→{c.to_host}:{c.port}",
            )
        )
    return out


def rule_p2p(facts: FleetFacts) -> list[Finding]:
    """A same-host prefill/decode pair whose GPUs have no peer-to-peer access: NIXL falls back to a much
    slower path through host memory. Without nvidia-smi (no NVIDIA GPU) this is said, not guessed."""
    out = []
    for host, matrix in sorted(facts.p2p.items()):
        if isinstance(matrix, str):
            out.append(Finding("kv.p2p", "ok", f"GPU P2P on {host} not checked", matrix, "", subject=host))
            continue
        pre = [g for i in facts.topology.on_host(host) if i.pool == "prefill" for g in i.gpus]
        dec = [g for i in facts.topology.on_host(host) if i.pool == "decode" for g in i.gpus]
        bad = [(a, b, matrix.get((a, b), "U")) for a in pre for b in dec if matrix.get((a, b), "U") != P2P_OK]
        if not bad:
            continue
        lines = [f"GPU{a} → GPU{b}: {s} ({P2P_MEANING.get(s, s)})" for a, b, s in bad]
        out.append(
            Finding(
                "kv.p2p",
                "error",
                f"no GPU peer-to-peer between the prefill and decode GPUs on {host}: "
                "KV moves through host memory (NIXL/UCX fall back), much slower",
                "nvidia-smi topo -p2p r\n" + "\n".join(lines),
                "put the pair on GPUs with P2P (pools.prefill.gpus / pools.decode.gpus under one PCIe "
                "switch or NVLink), or disable ACS/IOMMU isolation between them in the BIOS",
                subject=host,
            )
        )
    return out


def _roce_problems(facts: FleetFacts, rh: RdmaHostFacts) -> list[str]:
    """What the rdma role's decisions say is wrong on one host now."""
    rdma = facts.profile.rdma
    declared = tuple(rh.host.rdma_devices)
    problems = check_devices(declared, dict(rh.devices))
    if problems:
        return problems
    try:
        compute_gid_index(dict(rh.devices), declared, dict(rh.netdevs), rdma.gid_index)
    except RdmaError as exc:
        problems.append(f"GID index: {exc}")
    for name, info in sorted(rh.netdevs.items()):
        if info.mtu != rdma.mtu:
            problems.append(f"{name}: MTU {info.mtu}, the profile says rdma.mtu {rdma.mtu}")
        qos = rh.qos.get(name)
        if qos is not None and not qos_converged(qos, rdma.pfc_priority, rdma.dscp):
            problems.append(
                f"{name}: PFC/trust not as rdma.pfc_priority {rdma.pfc_priority}, dscp {rdma.dscp}"
            )
    return problems


def rule_roce(facts: FleetFacts) -> list[Finding]:
    """RoCE misconfigured on a cross-host pool host (device, GID index, MTU, PFC)."""
    out = []
    for rh in facts.rdma:
        problems = _roce_problems(facts, rh)
        if problems:
            mtu = next((i.mtu for i in rh.netdevs.values() if i.mtu != facts.profile.rdma.mtu), None)
            diff = (
                profile_fix(facts.profile, [("rdma.mtu", facts.profile.rdma.mtu, mtu)])
                if mtu is not None  # the fabric's MTU, when the profile is what is wrong
                else None
            )
            out.append(
                Finding(
                    "kv.roce",
                    "error",
                    f"RoCE is misconfigured on {rh.host.name}: KV transfers over RDMA stall or time out",
                    "\n".join(problems),
                    "invoke provision --profile P --roles rdma --limit "
                    + rh.host.name
                    + " (it applies GID index, MTU and PFC), or match the profile to the fabric",
                    diff,
                    subject=rh.host.name,
                )
            )
    return out


def rule_platform(facts: FleetFacts) -> list[Finding]:
    """A pool host on a platform pdfleet does not provision, a driver branch its platform lacks, or a CUDA
    repository for another distribution than it runs (an in-place upgrade): provision's own decisions."""
    out = []
    branch = driver_branch(facts.profile.gpu)
    for hp in facts.platforms:
        try:
            platform = resolve_platform(hp.host, hp.os)
        except PlatformRefusal as exc:
            fix = "run the host on a supported platform (docs/platforms.md); provision refuses it as it is"
            out.append(
                Finding(
                    "fleet.platform",
                    "error",
                    f"{hp.host} runs {hp.os.describe()}",
                    str(exc),
                    fix,
                    subject=hp.host,
                )
            )
            continue
        if not hp.gpus:
            continue
        try:
            check_branch(hp.host, platform, branch)
        except PlatformRefusal as exc:
            what = f"{hp.host}: no driver packages of branch {branch} on {platform.name}"
            fix = f"pin a gpu.driver_branch {platform.name} carries"
            out.append(Finding("fleet.driver_branch", "error", what, str(exc), fix, subject=hp.host))
            continue
        drift = repository_drift(hp.host, platform, hp.os, facts.profile.mirrors.cuda_repo, hp.cuda_list)
        if drift and hp.cuda_list:
            what = f"{hp.host}'s CUDA repository is not the one for {platform.name}"
            fix = "invoke provision --profile P: it plans the repository and packages for what the host runs"
            out.append(Finding("fleet.cuda_repo", "warning", what, drift, fix, subject=hp.host))
    return out


def _file_differences(files: Mapping[str, str], want: Mapping[str, str]) -> list[str]:
    """What a host's staged files lack or hold differently from `want` (path -> sha256), sorted."""
    out = [f"{path}: missing" for path in sorted(set(want) - set(files))]
    out += [
        f"{path}: sha256 {files[path][:12]}, expected {want[path][:12]}"
        for path in sorted(set(want) & set(files))
        if files[path] != want[path]
    ]
    return out + [f"{path}: not in the revision" for path in sorted(set(files) - set(want))]


def rule_weights(facts: FleetFacts) -> list[Finding]:
    """A model's prefill and decode instances serve one revision, and (a staged model) the same files as its
    manifest: otherwise KV transfer works but the output is garbage (caches computed by other weights)."""
    out: list[Finding] = []
    pd = [i for i in facts.instances if i.instance.pool in ("prefill", "decode") and i.problem is None]
    for name in dict.fromkeys(i.instance.model for i in pd):
        model = facts.profile.served_model(name).model
        mine = [i for i in pd if i.instance.model == name]
        revisions = {f"{i.instance.pool}@{i.instance.host}": i.revision or "floating" for i in mine}
        if len(set(revisions.values())) > 1:
            out.append(
                Finding(
                    "weights.revision_mismatch",
                    "error",
                    f"prefill and decode instances of {model.id} serve different revisions: KV transfer "
                    "works but the output is garbage",
                    "\n".join(f"{k}: revision {v}" for k, v in sorted(revisions.items())),
                    f"pin model.revision ({model.revision or 'the hub commit hash'}) and re-provision every "
                    "pool host: invoke provision --profile P",
                    subject=name,
                )
            )
        manifest = facts.manifests.get(model.id)
        if not model.staged or manifest is None:
            continue
        want = {f.path: f.sha256 for f in manifest.files}
        for i in mine:
            diffs = (
                ["the staged directory is missing"] if i.files is None else _file_differences(i.files, want)
            )
            if diffs:
                out.append(
                    Finding(
                        "weights.files",
                        "error",
                        f"{i.instance.host}'s {i.instance.pool} instance serves files other than {model.id} "
                        f"at {model.revision}: KV transfer works but the output is garbage",
                        "\n".join(diffs[:10] + ([f"... {len(diffs) - 10} more"] if len(diffs) > 10 else [])),
                        f"invoke provision --profile P --limit {i.instance.host} (the weights role fetches "
                        "the manifest's files and restarts the instance)",
                        subject=i.instance.host,
                    )
                )
    return out


FLEET_RULES = (
    rule_unreachable_hosts,
    rule_instances_unread,
    rule_connector_mismatch,
    rule_release_mismatch,
    rule_weights,
    rule_side_channel,
    rule_p2p,
    rule_roce,
    rule_platform,
)

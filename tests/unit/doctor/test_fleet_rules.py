"""The KV-transfer rules from fixture facts: each branch of each rule, on the lab's real profiles."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pdfleet.doctor.fleet_facts import (
    Connect,
    FleetFacts,
    HostPlatform,
    InstanceFacts,
    RdmaHostFacts,
    parse_p2p,
)
from pdfleet.doctor.fleet_rules import (
    rule_connector_mismatch,
    rule_instances_unread,
    rule_p2p,
    rule_platform,
    rule_release_mismatch,
    rule_roce,
    rule_side_channel,
    rule_unreachable_hosts,
    rule_weights,
)
from pdfleet.hw.os_facts import OsReleaseFact
from pdfleet.hw.rdma import netdev_of
from pdfleet.hw.rdma_facts import NetdevFact, QosFact, RdmaSysfsFact
from pdfleet.model.weights import ManifestFile, WeightsManifest
from tests.unit.doctor.helpers import deployment, fixture
from tests.unit.fleet.helpers import two_pd_deployment
from tests.unit.hw.helpers import load_fixture

FACTS = fixture("fleet-facts.yml")


def cross_facts(**over: object) -> FleetFacts:
    d = deployment("lab-cross")
    return dataclasses.replace(FleetFacts(d.profile, d.topology), **over)  # type: ignore[arg-type]


def pd(facts: FleetFacts, **per_pool: tuple[str | None, str | None, str | None]) -> tuple[InstanceFacts, ...]:
    """InstanceFacts of the prefill and decode instances: pool -> (connector, role, release)."""
    return tuple(InstanceFacts(i, *per_pool[i.pool]) for i in facts.topology.instances if i.pool in per_pool)


def test_matching_connectors_roles_and_releases_are_fine() -> None:
    f = cross_facts()
    f = dataclasses.replace(
        f,
        instances=pd(
            f,
            prefill=("NixlConnector", "kv_producer", f.profile.vllm.version),
            decode=("NixlConnector", "kv_consumer", f.profile.vllm.version),
        ),
    )
    assert rule_connector_mismatch(f) == [] and rule_release_mismatch(f) == []


def test_prefill_and_decode_on_different_connectors() -> None:
    f = cross_facts()
    f = dataclasses.replace(
        f,
        instances=pd(
            f,
            prefill=("NixlConnector", "kv_producer", None),
            decode=("MooncakeConnector", "kv_consumer", None),
        ),
    )
    found = rule_connector_mismatch(f)
    assert [x.rule for x in found] == ["kv.connector_mismatch"] and "MooncakeConnector" in found[0].evidence


def test_both_on_a_connector_the_profile_does_not_name() -> None:
    f = cross_facts()
    f = dataclasses.replace(
        f,
        instances=pd(
            f,
            prefill=("MooncakeConnector", "kv_producer", None),
            decode=("MooncakeConnector", "kv_consumer", None),
        ),
    )
    assert [x.rule for x in rule_connector_mismatch(f)] == ["kv.connector_drift"]


def test_two_models_on_two_connectors_are_each_held_to_their_own(tmp_path: Path) -> None:
    """nixl-8b on NIXL and moon-8b on Mooncake is no mismatch (one connector over all P/D instances was);
    moon-8b's decode on NIXL is a mismatch of moon-8b alone, naming its key path."""
    d = two_pd_deployment(tmp_path)
    f = FleetFacts(d.profile, d.topology)
    wanted = {"nixl-8b": "NixlConnector", "moon-8b": "MooncakeConnector"}
    roles = {"prefill": "kv_producer", "decode": "kv_consumer"}
    ok = tuple(
        InstanceFacts(i, wanted[i.model], roles[i.pool], None)
        for i in d.topology.instances
        if i.pool in roles
    )
    assert rule_connector_mismatch(dataclasses.replace(f, instances=ok)) == []
    bad = tuple(
        dataclasses.replace(x, connector="NixlConnector") if x.instance.host == "lab-d2" else x for x in ok
    )
    found = rule_connector_mismatch(dataclasses.replace(f, instances=bad))
    assert [(x.rule, x.subject) for x in found] == [
        ("kv.connector_mismatch", "models[1].kv_transfer.connector")
    ]
    assert "decode@lab-d2" in found[0].evidence and "lab-d1" not in found[0].evidence


def test_a_decode_instance_with_a_producer_role() -> None:
    f = cross_facts()
    f = dataclasses.replace(
        f,
        instances=pd(
            f, prefill=("NixlConnector", "kv_producer", None), decode=("NixlConnector", "kv_producer", None)
        ),
    )
    found = rule_connector_mismatch(f)
    assert [x.rule for x in found] == ["kv.role"] and "pools.decode.kv_role: kv_consumer" in found[0].fix


def test_release_mismatch_and_drift() -> None:
    f = cross_facts()
    mixed = dataclasses.replace(
        f, instances=pd(f, prefill=(None, None, "0.11.0"), decode=(None, None, "0.33.0"))
    )
    assert [x.rule for x in rule_release_mismatch(mixed)] == ["kv.release_mismatch"]
    other = "0.11.0" if f.profile.vllm.version != "0.11.0" else "0.33.0"
    drift = dataclasses.replace(f, instances=pd(f, prefill=(None, None, other), decode=(None, None, other)))
    found = rule_release_mismatch(drift)
    assert [x.rule for x in found] == ["kv.release_drift"] and found[0].severity == "warning"


def _connect(rc: int, text: str) -> Connect:
    return Connect(
        "lab-d1", "lab-p1", "198.18.0.21", 5600, "NIXL side channel", "timeout 3 bash -c ...", rc, text
    )


def test_side_channel_refused_and_dropped() -> None:
    refused, dropped = FACTS["connect_refused"], FACTS["connect_dropped"]
    found = rule_side_channel(
        cross_facts(
            connects=(_connect(refused["rc"], refused["text"]), _connect(dropped["rc"], dropped["text"]))
        )
    )
    assert [x.rule for x in found] == ["kv.side_channel"] * 2
    assert "refused" in found[0].what and "dropped" in found[1].what
    assert "allow TCP 5600 from lab-d1 to lab-p1" in found[0].fix
    assert rule_side_channel(cross_facts(connects=(_connect(0, "connected"),))) == []


def test_unreachable_hosts_are_errors() -> None:
    found = rule_unreachable_hosts(cross_facts(unreachable={"lab-d1": "connection refused"}))
    assert found[0].severity == "error" and found[0].subject == "lab-d1"


def test_p2p_on_a_same_host_pair() -> None:
    d = deployment("lab-same-host", "inventory/lab-same-host.yml")
    matrix = parse_p2p(FACTS["p2p_matrix"]["text"])
    assert matrix[(0, 1)] == "OK" and matrix[(1, 2)] == "CNS"
    base = FleetFacts(d.profile, d.topology)
    assert rule_p2p(dataclasses.replace(base, p2p={"lab-p1": matrix})) == []  # GPU0 → GPU1: OK
    no_p2p = {**matrix, (0, 1): "CNS"}
    found = rule_p2p(dataclasses.replace(base, p2p={"lab-p1": no_p2p}))
    assert (
        found[0].rule == "kv.p2p"
        and found[0].severity == "error"
        and "chipset not supported" in found[0].evidence
    )
    unchecked = rule_p2p(dataclasses.replace(base, p2p={"lab-p1": "nvidia-smi: not found"}))
    assert unchecked[0].severity == "ok" and "not checked" in unchecked[0].what


def _roce(devices: tuple[str, ...], mtu: int | None = None) -> list:
    d = deployment("cross-rdma", "inventory/examples/cross-rdma.yml")
    table = load_fixture("h100-sxm-8x-nvswitch-cx7")
    host = dataclasses.replace(
        next(h for h in d.inventory.hosts.values() if h.rdma_devices), rdma_devices=devices
    )
    found = table[RdmaSysfsFact()]
    netdevs = {nd: table[NetdevFact(nd)] for nd in netdev_of(found, devices).values()}
    if mtu is not None:
        netdevs = {nd: dataclasses.replace(info, mtu=mtu) for nd, info in netdevs.items()}
    qos = {nd: table[QosFact(nd, "mlnx_qos")] for nd in netdevs}
    facts = dataclasses.replace(
        FleetFacts(d.profile, d.topology), rdma=(RdmaHostFacts(host, found, netdevs, qos),)
    )
    return rule_roce(facts)


def test_roce_a_declared_device_the_host_lacks() -> None:
    found = _roce(("mlx5_9",))
    assert found and found[0].rule == "kv.roce" and "no such RDMA device" in found[0].evidence


def test_roce_mtu_other_than_the_profile() -> None:
    found = _roce(("mlx5_0",), mtu=1500)
    assert found and "MTU 1500" in found[0].evidence
    assert found[0].diff is not None and "+rdma.mtu: 1500" in found[0].diff


def test_instances_that_could_not_be_read_are_said() -> None:
    f = cross_facts()
    prefill = f.topology.pool("prefill")[0]
    found = rule_instances_unread(
        dataclasses.replace(f, instances=(InstanceFacts(prefill, problem="no unit"),))
    )
    assert found[0].severity == "warning" and "prefill@lab-p1: no unit" in found[0].evidence
    # an unreachable host is said once, by rule_unreachable_hosts
    gone = dataclasses.replace(
        f, instances=(InstanceFacts(prefill, problem="x"),), unreachable={"lab-p1": "down"}
    )
    assert rule_instances_unread(gone) == []


def _platform(host: str, distro: str, gpus: bool = True, listed: str = "") -> HostPlatform:
    return HostPlatform(host, load_fixture(distro)[OsReleaseFact()], gpus, listed)


def test_platform_an_unsupported_host_is_an_error_naming_what_it_runs() -> None:
    [found] = rule_platform(cross_facts(platforms=(_platform("lab-p1", "rocky-9"),)))
    assert (found.rule, found.severity, found.subject) == ("fleet.platform", "error", "lab-p1")
    assert (
        found.what == "lab-p1 runs Rocky Linux 9.4 (Blue Onyx) (x86_64)"
        and "supported: Debian 12" in found.evidence
    )


def test_platform_a_host_upgraded_in_place_shows_its_old_repository() -> None:
    cuda = "https://developer.download.nvidia.com/compute/cuda/repos"
    jammy = f"deb [signed-by=/etc/apt/keyrings/cuda.asc] {cuda}/ubuntu2204/x86_64/ /\n"
    [found] = rule_platform(cross_facts(platforms=(_platform("lab-p1", "ubuntu-24.04", listed=jammy),)))
    assert (found.rule, found.severity) == ("fleet.cuda_repo", "warning")
    assert (
        f"{cuda}/ubuntu2204/x86_64/" in found.evidence
        and f"provision plans {cuda}/ubuntu2404/x86_64/" in found.evidence
    )
    noble = jammy.replace("2204", "2404")
    assert rule_platform(cross_facts(platforms=(_platform("lab-p1", "ubuntu-24.04", listed=noble),))) == []


def test_platform_a_branch_the_host_lacks_and_gpu_less_debian_hosts_pass() -> None:
    facts = cross_facts(platforms=(_platform("lab-p1", "dgx-os-6"),))  # lab-cross pins R580; DGX OS 6 has 550
    [found] = rule_platform(facts)
    assert found.rule == "fleet.driver_branch" and "its repository carries 550" in found.evidence
    lab = (_platform("lab-p1", "debian-12", gpus=False), _platform("lab-d1", "debian-12", gpus=False))
    assert rule_platform(cross_facts(platforms=lab)) == []


def _weights_facts(revisions: dict[str, str | None], files: dict[str, dict[str, str] | None]) -> FleetFacts:
    """lab-weights' prefill and decode instances serving these revisions and staged files (by pool), with
    a two-file manifest."""
    d = deployment("lab-weights")
    manifest = WeightsManifest(
        model=d.profile.model.id,
        revision="lab-r1",
        files=(
            ManifestFile(path="a", size=1, sha256="a" * 64),
            ManifestFile(path="b", size=1, sha256="b" * 64),
        ),
    )
    instances = tuple(
        InstanceFacts(i, "NixlConnector", None, "0.33.0", None, revisions[i.pool], files[i.pool])
        for i in d.topology.instances
        if i.pool in revisions
    )
    return FleetFacts(d.profile, d.topology, instances, manifests={d.profile.model.id: manifest})


def test_one_revision_and_the_manifest_s_files_are_fine() -> None:
    good = {"a": "a" * 64, "b": "b" * 64}
    assert (
        rule_weights(
            _weights_facts({"prefill": "lab-r1", "decode": "lab-r1"}, {"prefill": good, "decode": good})
        )
        == []
    )


def test_a_decode_instance_on_another_revision_or_with_swapped_files_is_named() -> None:
    good = {"a": "a" * 64, "b": "b" * 64}
    swapped = {"a": "b" * 64, "b": "b" * 64, "extra": "c" * 64}
    (revision, files) = rule_weights(
        _weights_facts({"prefill": "lab-r1", "decode": "lab-r2"}, {"prefill": good, "decode": swapped})
    )
    assert revision.rule == "weights.revision_mismatch" and revision.severity == "error"
    assert "serve different revisions: KV transfer works but the output is garbage" in revision.what
    assert revision.evidence == "decode@lab-d1: revision lab-r2\nprefill@lab-p1: revision lab-r1"
    assert files.rule == "weights.files" and files.subject == "lab-d1"
    assert files.what.startswith("lab-d1's decode instance serves files other than meta-llama/Llama-3.1-8B")
    assert files.evidence == f"a: sha256 {'b' * 12}, expected {'a' * 12}\nextra: not in the revision"
    assert "--limit lab-d1" in files.fix
    (missing,) = rule_weights(
        _weights_facts({"prefill": "lab-r1", "decode": "lab-r1"}, {"prefill": good, "decode": None})
    )
    assert missing.subject == "lab-d1" and missing.evidence == "the staged directory is missing"


def test_an_unstaged_model_is_checked_for_its_revision_only() -> None:
    f = cross_facts()
    f = dataclasses.replace(
        f,
        instances=tuple(
            InstanceFacts(i, "NixlConnector", None, "0.33.0", None, "r1" if i.pool == "prefill" else None)
            for i in f.topology.instances
            if i.pool in ("prefill", "decode")
        ),
    )
    (finding,) = rule_weights(f)
    assert finding.evidence == "decode@lab-d1: revision floating\nprefill@lab-p1: revision r1"

"""The fleet gatherer's parsers from fixtures, and its commands run for real: the TCP connect through this
machine's own shell (LocalTransport) against a loopback listener, open and then closed."""

from __future__ import annotations

import dataclasses
import platform
import socket
from pathlib import Path

import pytest

from pdfleet.bench.procs import free_port
from pdfleet.doctor.fleet_facts import (
    P2pMatrix,
    TcpConnect,
    connect_command,
    connects_planned,
    facts_to_gather,
    pair_hosts,
    parse_p2p,
    parse_unit,
    read_connects,
    read_instances,
    read_p2p,
    read_platforms,
    reported_release,
    side_channel_targets,
    unit_revision,
)
from pdfleet.fleet.topology import Instance, Topology
from pdfleet.hw.distro import CUDA_SOURCE
from pdfleet.hw.gpu_facts import NvidiaPciFact
from pdfleet.hw.os_facts import OsReleaseFact
from pdfleet.model.vllm_release_data import RELEASES
from pdfleet.ops.base import FakeFacts
from pdfleet.ops.files import FileContent
from pdfleet.ops.gather import HostFacts
from pdfleet.ops.ssh import LocalTransport
from pdfleet.ops.unit_health import UnitHealth, UnitState
from tests.unit.doctor.helpers import deployment, fixture
from tests.unit.fleet.helpers import REPO, deploy, two_pd_deployment

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py

FACTS = fixture("fleet-facts.yml")


def test_parse_unit() -> None:
    assert parse_unit(FACTS["unit_prefill"]["text"]) == ("NixlConnector", "kv_producer", None)
    assert parse_unit(FACTS["unit_sim_decode"]["text"]) == ("MooncakeConnector", "kv_consumer", "0.11.0")
    assert parse_unit("ExecStart=/bin/true 'unbalanced") == (None, None, None)
    assert parse_unit("[Unit]\n") == (None, None, None)


def test_reported_release() -> None:
    assert reported_release(FACTS["version_vllm"]["text"]) == "0.11.0"
    assert reported_release(FACTS["version_sim"]["text"]) is None
    assert reported_release("not json") is None


def test_parse_p2p() -> None:
    matrix = parse_p2p(FACTS["p2p_matrix"]["text"])
    assert matrix[(0, 0)] == "X" and matrix[(2, 3)] == "OK" and matrix[(0, 3)] == "CNS"
    assert parse_p2p("nvidia-smi: command not found") == {}


def test_side_channel_ports_follow_the_release() -> None:
    d = deployment("lab-cross")
    rel = RELEASES[d.profile.vllm.version]
    targets = side_channel_targets(d.profile, d.topology, rel)
    assert [(i.host, p, what) for i, p, what in targets] == [("lab-p1", 5600, "NIXL side channel")]


def test_each_decode_host_reaches_its_own_model_s_prefill_by_that_model_s_connector(tmp_path: Path) -> None:
    """Two P/D models, NIXL and Mooncake: lab-d1 (nixl-8b's decode) connects to nixl-8b's prefill side
    channel only, lab-d2 (moon-8b's) to moon-8b's Mooncake bootstrap port only (the first model's
    connector read for both left Mooncake's port unchecked and sent lab-d2 to lab-p1)."""
    d = two_pd_deployment(tmp_path)
    planned = connects_planned(d.profile, d.topology)
    got = {host: [(i.host, port, what) for i, port, what, _ in c] for host, c in planned.items()}
    assert got == {
        "lab-d1": [("lab-p1", 5600, "NIXL side channel")],
        "lab-d2": [("lab-p2", 8998, "Mooncake bootstrap")],
    }


@pytest.mark.parametrize(("pin", "ports"), [("0.11.0", [5600, 5601]), ("0.11.2", [5600])])
def test_a_patch_pin_probes_its_own_release_s_ports(pin: str, ports: list[int]) -> None:
    """TP 2 on 0.11.0 binds one port per rank; 0.11.2 one listener (a 0.11.2 pin read as 0.11.0 would
    probe a port nothing binds: a false alarm)."""
    d = deployment("lab-cross")
    prefill = d.profile.pools.prefill
    assert prefill is not None
    profile = d.profile.model_copy(
        update={
            "vllm": d.profile.vllm.model_copy(update={"version": pin}),
            "pools": d.profile.pools.model_copy(
                update={"prefill": prefill.model_copy(update={"tensor_parallel_size": 2})}
            ),
        }
    )
    planned = connects_planned(profile, d.topology)
    assert [port for host in planned.values() for _, port, _, _ in host] == ports


def _loopback(topology: Topology, port: int) -> Topology:
    """The topology with its prefill side channel on 127.0.0.1:port (what this machine may reach)."""

    def move(i: Instance) -> Instance:
        # every address on loopback: nothing a test gathers may leave this machine
        if i.pool == "prefill":
            return dataclasses.replace(
                i, address="127.0.0.1", side_channel_host="127.0.0.1", side_channel_port=port
            )
        return dataclasses.replace(i, address="127.0.0.1", side_channel_host="127.0.0.1")

    return dataclasses.replace(topology, instances=tuple(move(i) for i in topology.instances))


def test_connect_runs_on_the_decode_host_open_then_refused() -> None:
    d = deployment("lab-cross")
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        topo = _loopback(d.topology, port)
        (ok,) = read_connects(d.profile, topo, {"lab-d1": HostFacts(LocalTransport("lab-d1"))})
        assert ok.open and ok.from_host == "lab-d1" and ok.to_host == "lab-p1"
    closed = free_port()
    local = {"lab-d1": HostFacts(LocalTransport("lab-d1"))}
    (refused,) = read_connects(d.profile, _loopback(d.topology, closed), local)
    assert not refused.open and refused.rc == 1 and "refused" in refused.output.lower()
    assert refused.command == connect_command("127.0.0.1", closed)


def test_instances_without_a_unit_or_a_host_say_why() -> None:
    d = deployment("lab-cross")
    loop = _loopback(d.topology, free_port())
    one = dataclasses.replace(loop, instances=loop.pool("prefill") + loop.pool("decode"))
    facts = read_instances(one, {"lab-p1": HostFacts(LocalTransport("lab-p1"))}, timeout=5)
    by_host = {f.instance.host: f for f in facts}
    assert by_host["lab-p1"].problem == "/etc/systemd/system/vllm-prefill.service: no such unit file"
    assert by_host["lab-d1"].problem == "lab-d1 not reachable over SSH"


def test_an_instance_that_does_not_answer_says_what_its_unit_is() -> None:
    d = deployment("lab-cross")
    loop = _loopback(d.topology, free_port())  # nothing listens: /version cannot answer
    [inst] = loop.pool("prefill")
    one = dataclasses.replace(loop, instances=[inst])
    failed = UnitState("loaded", "failed", "failed", "enabled")
    config = '\'{"kv_connector":"NixlConnector"}\''
    unit = f"ExecStart=/opt/pdfleet/venv/bin/vllm serve m --kv-transfer-config {config}\n"
    facts = FakeFacts({FileContent(inst.unit_path): unit, UnitHealth(inst.unit): failed})
    [read] = read_instances(one, {"lab-p1": facts}, timeout=2)
    assert read.connector == "NixlConnector" and read.problem is not None
    assert read.problem.startswith(f"{inst.url}/version: ")
    assert read.problem.endswith("(vllm-prefill.service failed)")


def test_each_host_answers_in_one_batch() -> None:
    d = deployment("lab-same-host", "inventory/lab-same-host.yml")
    plan = facts_to_gather(d.profile, d.topology)
    assert FileContent("/etc/systemd/system/vllm-prefill.service") in plan["lab-p1"]
    [prefill] = d.topology.pool("prefill")
    assert UnitHealth(prefill.unit) in plan["lab-p1"]
    assert P2pMatrix() in plan["lab-p1"] and NvidiaPciFact() in plan["lab-p1"]  # the same-host pair's host
    assert TcpConnect("198.18.0.21", 5600) in plan["lab-p1"]  # the decode instance lives there too
    assert (
        P2pMatrix().parse("sh: 1: nvidia-smi: not found", 127).startswith("`nvidia-smi topo -p2p r` gave no")
    )


def test_the_same_host_pair_of_a_second_model_is_asked_for_its_p2p_matrix(tmp_path: Path) -> None:
    """A models: profile whose top level and first model are colocated and whose second runs P/D on lab-p1
    (same-host): lab-p1 is a same-host pair (the profile's top-level topology read asked it nothing)."""
    inventory = tmp_path / "inventory.yml"  # lab-colo1 with a second GPU for the colocated model
    text = (REPO / "inventory/lab-same-host.yml").read_text()
    inventory.write_text(
        text.replace(
            "ansible_host: 198.18.0.11\n          gpus: [0]",
            "ansible_host: 198.18.0.11\n          gpus: [0, 1]",
        )
    )
    path = tmp_path / "two.yml"
    path.write_text(
        "extends: lab-same-host\ngateway: {model_alias: null}\nmodels:\n"
        "  - {name: chat, aliases: [chat], topology: colocated,\n"
        "     pools: {prefill: null, decode: null, colocated: {port: 8001, gpus: [1]}}}\n"
        "  - {name: big, aliases: [big], topology: same-host}\n"
        "topology: colocated\n"  # the file's top level, which the profile's own `topology` reads
    )
    d = deploy(str(path), inventory, secrets=None)
    assert [s.topology for s in d.profile.served] == ["colocated", "same-host"]
    assert pair_hosts(d.profile, d.topology) == ["lab-p1"]
    assert P2pMatrix() in facts_to_gather(d.profile, d.topology)["lab-p1"]
    assert pair_hosts(deployment("lab-cross").profile, deployment("lab-cross").topology) == []


def test_p2p_of_a_host_without_gpus_says_so_as_the_gpu_role_does() -> None:
    d = deployment("lab-same-host", "inventory/lab-same-host.yml")
    local = HostFacts(LocalTransport("lab-p1"))
    local.gather([NvidiaPciFact(), P2pMatrix()])  # only these: the plan's connects go to lab addresses
    if local.get(NvidiaPciFact()).gpus:
        pytest.skip("this machine has an NVIDIA GPU: the matrix is read instead")
    assert read_p2p(d.profile, d.topology, {"lab-p1": local}) == {"lab-p1": "no NVIDIA GPU on the PCI bus"}


def test_each_pool_host_is_asked_what_it_runs_and_this_machine_answers_for_real() -> None:
    d = deployment("lab-cross")
    plan = facts_to_gather(d.profile, d.topology)
    for host in {i.host for i in d.topology.instances}:
        assert {OsReleaseFact(), NvidiaPciFact(), FileContent(CUDA_SOURCE)} <= set(plan[host])
        assert len(plan[host]) == len(set(plan[host]))
    local = HostFacts(LocalTransport("lab-p1"))
    local.gather([OsReleaseFact(), NvidiaPciFact(), FileContent(CUDA_SOURCE)])
    [mine] = read_platforms(d.topology, {"lab-p1": local})
    release = platform.freedesktop_os_release()  # Python's own reading of /etc/os-release
    assert (mine.host, mine.os.id, mine.os.version_id) == (
        "lab-p1",
        release["ID"],
        release.get("VERSION_ID", ""),
    )
    assert mine.os.arch == platform.machine()


def test_unit_revision_reads_the_revision_flag_or_the_staged_directory() -> None:
    assert unit_revision(FACTS["unit_prefill"]["text"]) is None  # a floating revision
    sim = "ExecStart=/opt/v/bin/pdfleet-sim serve org/m --port 1 --revision lab-r1 --sim-gpu H100-SXM\n"
    staged = "ExecStart=/opt/v/bin/vllm serve /var/lib/pdfleet/models/org/m/abc123 --port 1\n"
    assert unit_revision(sim) == "lab-r1" and unit_revision(staged) == "abc123"
    assert unit_revision("ExecStart=/opt/v/bin/vllm serve /data/m --port 1\n") is None

"""The fleet view end to end on this machine: lab-cross's topology with every host at 127.0.0.1, commands
through the local shell, and the metrics of two real simulators under load (a decode short of KV blocks,
a prefill with a 512-token budget), read by a direct scrape."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import time
import urllib.request
from pathlib import Path

import pytest

from pdfleet.bench.launch import SimProcess
from pdfleet.bench.procs import free_port
from pdfleet.doctor.fleet import diagnose_fleet, gather_fleet
from pdfleet.doctor.fleet_facts import FleetFacts, RoleFigures
from pdfleet.fleet.topology import Instance, Topology
from pdfleet.metrics.direct import DirectScrape, Target
from pdfleet.model.inventory import Host
from pdfleet.ops.ssh import LocalTransport
from tests.unit.doctor.helpers import deployment
from tests.unit.sim.helpers import MODEL

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py

SIM = [MODEL, "--sim-time-scale", "0.02"]


def _post(url: str, words: int, max_tokens: int, n: int) -> None:
    """A prompt of its own (its first word differs): no prefix cache hit lightens the load."""
    body = {"model": MODEL, "prompt": f"request{n} " + "word " * words, "max_tokens": max_tokens}
    req = urllib.request.Request(
        url + "/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        resp.read()


def _loopback(topology: Topology) -> Topology:
    """lab-cross's topology with every instance at 127.0.0.1 and the side channel on a closed port."""
    closed = free_port()

    def move(i: Instance) -> Instance:
        side = {"side_channel_host": "127.0.0.1", "side_channel_port": closed} if i.pool == "prefill" else {}
        return dataclasses.replace(i, address="127.0.0.1", **side)  # type: ignore[arg-type]

    return dataclasses.replace(topology, instances=tuple(move(i) for i in topology.instances))


def test_the_fleet_view_names_the_side_channel_and_both_tuning_faults(tmp_path: Path) -> None:
    d = deployment("lab-cross")
    topology = _loopback(d.topology)
    # the decode simulator at a tenth of real time, not SIM's fiftieth: each request decodes for ~1.5 s, so
    # all 24 are in flight together and outgrow the KV cache however slowly a loaded machine submits them
    short_kv = [
        MODEL,
        "--sim-time-scale",
        "0.1",
        "--gpu-memory-utilization",
        "0.25",
        "--max-model-len",
        "16384",
    ]
    with SimProcess(short_kv) as dec, SimProcess([*SIM, "--max-num-batched-tokens", "512"]) as pre:
        source = DirectScrape(
            [
                Target(dec.url + "/metrics", {"role": "decode"}),
                Target(pre.url + "/metrics", {"role": "prefill"}),
            ]
        )
        source.scrape()
        loaded_from = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            jobs = [pool.submit(_post, dec.url, 800, 1500, n) for n in range(24)]
            jobs += [pool.submit(_post, pre.url, 6000, 1, n) for n in range(16)]
            for job in jobs:
                job.result()

        def metrics() -> tuple[DirectScrape, str, float]:
            # the window reaches back to the scrape before the load: a fixed 1 s window compared the
            # scrapes doctor takes itself once gathering took over half a second (a loaded machine)
            return source, "direct scrape", max(1.0, time.monotonic() - loaded_from)

        def connect(host: Host) -> LocalTransport:
            return LocalTransport(host.name)

        facts = gather_fleet(d.profile, d.inventory, topology, connect, metrics, timeout=5)
    findings = {f.rule: f for f in diagnose_fleet(facts)}
    assert findings["kv.side_channel"].severity == "error"
    assert "lab-d1 (decode) cannot reach the NIXL side channel of lab-p1" in findings["kv.side_channel"].what
    assert findings["tuning.decode_preemption"].severity == "warning"
    assert "max_num_seqs" in (findings["tuning.decode_preemption"].diff or "")
    assert "+pools.prefill.max_num_batched_tokens: 16384" in (findings["tuning.prefill_queue"].diff or "")
    # no unit files on this machine: said, not taken for a match
    assert findings["fleet.instance_unread"].severity == "warning"


def test_each_model_is_diagnosed_against_its_own_pools_and_figures() -> None:
    """lab-two-models: the small model's colocated pool preempting is advised in its own keys, the P/D
    model's quiet figures give nothing, and an unread figure is said with its model."""
    d = deployment("lab-two-models")
    preempting = RoleFigures("colocated", preemptions_per_min=30, kv_usage=0.99)
    quiet = {r: RoleFigures(r, preemptions_per_min=0.0) for r in ("decode", "colocated")}
    unread = RoleFigures("prefill", missing=("queue P95: no target",))
    figures = {"llama-8b": {**quiet, "prefill": unread}, "llama-1b": {"colocated": preempting}}
    found = diagnose_fleet(FleetFacts(d.profile, d.topology, figures=figures, metrics_source="direct"))
    tuning = [f for f in found if f.rule.startswith("tuning.")]
    assert [(f.rule, f.subject) for f in tuning] == [("tuning.colocated_preemption", "llama-1b/colocated")]
    assert "+models[1].pools.colocated.max_num_seqs" in (tuning[0].diff or "")
    (unread_finding,) = [f for f in found if f.rule == "metrics.unread"]
    assert "llama-8b/prefill: queue P95: no target" in unread_finding.evidence

"""The simulator's KV bytes through Mooncake's real transfer engine (issue 29): its log read for a failure's
reason, then the real engine: two engines in this process, and a producer and a consumer simulator behind
the real `vllm-router --kv-connector mooncake` moving each request's scaled KV bytes over Mooncake's TCP
transport on loopback. The engine's wheel comes from the lab's PyPI mirror and Debian's libibverbs1 (with
its libnl dependencies) from the lab's apt mirror (what `invoke lab.build` fetches), unpacked once per run
into a temporary directory; without them those tests skip, saying so.

The engine listens on every interface (its handshake and TCP acceptors bind 0.0.0.0 and [::]; 0.3.13.post1
has no option to bind one address: MC_TCP_BIND_ADDRESS only names the address it announces), so the real
engine's tests run in a network namespace of their own holding only `lo`: what listens is reachable from
loopback only, as everything a test runs must be. In the lab each engine is in its nspawn host's namespace."""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pdfleet.bench.launch import RouterProcess, SimProcess, free_port
from pdfleet.lab.paths import LabPaths
from pdfleet.metrics.scrape import scrape_metrics
from pdfleet.sim.kv_library import LibraryError, LibrarySettings, Offer, scaled
from pdfleet.sim.kv_mooncake import MooncakeEngine, engine_errors, start_library
from tests.unit.sim.helpers import (
    KV_BYTES_8B,
    library_bytes,
    library_env,
    library_pair,
    loopback_netns,
    stream_chats,
)

pytestmark = pytest.mark.procs  # pip installs the wheel; the simulators and the router are processes

DEBS = ("libibverbs1", "libnl-3-200", "libnl-route-3-200")
LIBS = ("libnl-3.so.200", "libnl-route-3.so.200", "libibverbs.so.1")  # in load order


# ---- pure ---------------------------------------------------------------------------------------------


def test_a_failure_s_reason_is_the_engine_s_error_lines_since_the_call() -> None:
    lines = [
        "0\tE1203 17:45:17.000001 1 old.cpp:1] an earlier failure",
        "1\tI1203 17:45:17.957691 17464 transfer_engine_py.cpp:492] transferSync, cache not found",
        "2\tE1203 17:45:17.957858 17464 transfer_metadata_plugin.cpp:1030] SocketHandShakePlugin: "
        "connect()198.18.0.21:16134: Connection refused [111]",
        "3\tE1203 17:45:17.957858 17464 transfer_metadata_plugin.cpp:1030] SocketHandShakePlugin: "
        "connect()198.18.0.21:16134: Connection refused [111]",
        "4\tsome Python logging line",
    ]
    assert (
        engine_errors(lines, 1)
        == "SocketHandShakePlugin: connect()198.18.0.21:16134: Connection refused [111]"
    )
    assert engine_errors(lines, 4) == ""


# ---- the real engine ----------------------------------------------------------------------------------


def _mirror_files(pattern: str, where: list[Path]) -> list[Path]:
    return sorted(p for d in where if d.is_dir() for p in d.glob(pattern))


@pytest.fixture(scope="module")
def mooncake_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """PYTHONPATH holding the engine (the lab mirror's wheel) and LD_LIBRARY_PATH holding libibverbs1 and
    its libnl libraries (the lab apt mirror's .debs), for a process that imports mooncake.engine."""
    paths = LabPaths()
    wheels = _mirror_files(
        "mooncake_transfer_engine_non_cuda-*-cp311-*.whl",
        [paths.pypi_dir / "packages", *sorted((paths.mirrors_dir / "pypi-deps").glob("*"))],
    )
    debs = [_mirror_files(f"{name}_*.deb", [paths.apt_served]) for name in DEBS]
    if not wheels or not all(debs) or sys.version_info[:2] != (3, 11):
        pytest.skip(f"no Mooncake cp311 wheel or libibverbs1 .debs in {paths.mirrors_dir} (invoke lab.build)")
    target = tmp_path_factory.mktemp("mooncake")
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target", str(target)]
    subprocess.run([*cmd, str(wheels[-1])], check=True, capture_output=True, timeout=300)
    root = tmp_path_factory.mktemp("ibverbs")
    for found in debs:
        subprocess.run(["dpkg-deb", "-x", str(found[-1]), str(root)], check=True, timeout=60)
    libs = sorted({str(p.parent) for p in root.rglob("*.so.*")})
    return {"PYTHONPATH": str(target), "LD_LIBRARY_PATH": os.pathsep.join(libs)}


@pytest.fixture(scope="module")
def own_netns() -> Iterator[None]:
    """The module's engines, simulators, router and probes in a network namespace holding only `lo`."""
    with loopback_netns():
        yield


@pytest.fixture
def engine_here(mooncake_env: dict[str, str], own_netns: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """mooncake.engine importable in this process: its libraries loaded by soname first (RTLD_GLOBAL)."""
    monkeypatch.syspath_prepend(mooncake_env["PYTHONPATH"])
    dirs = mooncake_env["LD_LIBRARY_PATH"].split(os.pathsep)
    for lib in LIBS:
        path = next(Path(d, lib) for d in dirs if Path(d, lib).exists())
        ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)


def test_two_engines_move_the_blocks_and_a_failure_names_mooncake_s_logged_reason(engine_here: None) -> None:
    settings = LibrarySettings("mooncake", 0.01, buffer_bytes=1 << 20)

    async def run() -> tuple[int, str, str, str]:
        producer = await start_library(settings, "mooncake", "test-p", "127.0.0.1", producer=True)
        consumer = await start_library(settings, "mooncake", "test-d", "127.0.0.1", producer=False)
        assert isinstance(producer, MooncakeEngine) and producer.session.startswith("127.0.0.1:")
        try:
            offer = producer.offer("req-1", 500 * KV_BYTES_8B, 32)
            moved = await consumer.read(offer, 12, "req-1")
            nowhere = Offer(f"127.0.0.1:{free_port()}", offer.base, 0, 64, 1)  # no engine listens there
            with pytest.raises(LibraryError) as refused:
                await consumer.read(nowhere, 1, "req-2")
            outside = Offer(offer.metadata, offer.base + (2 << 20), 0, 64, 1)  # past the registered buffer
            with pytest.raises(LibraryError) as bad_read:
                await consumer.read(outside, 1, "req-3")
            with pytest.raises(LibraryError) as mismatched:
                await start_library(settings, "nixl", "test-x", "127.0.0.1", producer=False)
            return moved, str(refused.value), str(bad_read.value), str(mismatched.value)
        finally:
            producer.close()
            consumer.close()

    moved, refused, bad_read, mismatched = asyncio.run(run())
    # the 12 blocks past a 20-block cache hit, each 0.01 of a block's 500 * 128 KiB / 32 in whole words
    assert moved == 12 * scaled(500 * KV_BYTES_8B, 32, 0.01, 1 << 20)
    # -1 from the engine, the reason from its own log
    assert "returned -1; Mooncake's log: " in refused and "Connection refused" in refused, refused
    assert "not within any registered buffer" in bad_read, bad_read
    assert mismatched == "kv-transfer.env moves KV with mooncake, this connector with nixl"


@pytest.fixture(scope="module")
def engine_pair(
    mooncake_env: dict[str, str], own_netns: None
) -> Iterator[tuple[SimProcess, SimProcess, int]]:
    """A MooncakeConnector producer and consumer simulator with the engine on, as kv-transfer.env has it
    with sim_library (the settings pdfleet renders for Mooncake over tcp included)."""
    engine = {"MC_TRANSFER_TIMEOUT": "10", "MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER": "65535"}
    env = {**mooncake_env, **library_env("mooncake", mooncake_env["PYTHONPATH"], **engine)}
    boot = free_port()
    with library_pair("MooncakeConnector", env, {"VLLM_MOONCAKE_BOOTSTRAP_PORT": str(boot)}) as (p, d):
        yield p, d, boot


def test_streamed_requests_through_the_router_move_their_bytes_through_mooncake_s_engine(
    engine_pair: tuple[SimProcess, SimProcess, int],
) -> None:
    producer, consumer, boot = engine_pair
    before = scrape_metrics(producer.url)
    mode = {"kv_connector": "mooncake", "bootstrap_ports": [boot]}
    with RouterProcess([producer.url], [consumer.url], **mode) as router:  # type: ignore[arg-type]
        usages = stream_chats(router.url)
    after = scrape_metrics(producer.url)
    # Mooncake's P observes each transfer (stats.py): the bytes its engine moved, 0.01 of each block's
    bytes_ = "vllm:mooncake_bytes_transferred"
    assert after[f"{bytes_}_count"] - before[f"{bytes_}_count"] == 3
    assert after[f"{bytes_}_sum"] - before[f"{bytes_}_sum"] == library_bytes(usages)
    assert scrape_metrics(consumer.url)["vllm:mooncake_num_failed_recvs_total"] == 0
    # the engine's own lines on both sides (glog, not the simulator's logger), and no failed pull
    for proc in (producer, consumer):
        assert "Transfer Engine RPC using P2P handshake" in proc.log()
        assert (
            "KV bytes move through Mooncake's transfer engine (tcp, P2PHANDSHAKE at 127.0.0.1:" in proc.log()
        )
    assert "pulling kv_caches for" not in consumer.log()


def test_verify_s_probe_moves_a_buffer_over_mooncake_and_a_refused_engine_port_fails_at_once(
    mooncake_env: dict[str, str], own_netns: None, tmp_path: Path
) -> None:
    """`verify --kv-path`'s probe program (templates/kv_probe.py) with --library mooncake on loopback: the
    prefill side's engine offers its session, the decode side reads 4 MiB and checks it; then, against an
    offer naming a port nobody listens on, the decode side fails at its connect stage within a second."""
    probe = str(Path(__file__).resolve().parents[3] / "templates" / "kv_probe.py")
    env = {**os.environ, **mooncake_env}
    port = free_port()
    common = ["--library", "mooncake", "--host", "127.0.0.1", "--port", str(port), "--timeout", "10"]
    with (tmp_path / "serve.log").open("w") as log:
        serve = subprocess.Popen(  # noqa: S603 - the probe program, argv only
            [sys.executable, probe, "serve", *common, "--bytes", str(4 << 20)],
            env=env,
            stdout=log,
            stderr=log,
        )
        try:
            fetch = subprocess.run(
                [sys.executable, probe, "fetch", *common, "--peer", "127.0.0.1"],
                env=env,
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert serve.wait(timeout=15) == 0
        finally:
            serve.kill()
    result = json.loads(fetch.stdout.splitlines()[-1])
    assert result["ok"] and result["bytes"] == 4 << 20 and result["seconds"] > 0, fetch.stdout + fetch.stderr
    assert "stage transfer" in fetch.stdout and "Transfer Engine RPC using P2P handshake" in fetch.stderr
    sys.path.insert(0, str(Path(probe).parent))
    try:
        import kv_probe  # the probe's own check of the data listeners, against a closed port
    finally:
        sys.path.pop(0)
    assert "Connection refused" in (
        kv_probe.reach_data_ports("127.0.0.1", [["0.0.0.0", free_port()]], 1.0) or ""
    )

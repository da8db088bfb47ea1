"""The simulator's KV bytes through NIXL (issue 29): the pure sizing and checking, then the real library:
two agents in this process, and a producer and a consumer simulator behind the real vllm-router moving
each request's scaled KV bytes over UCX on loopback. NIXL's CPU build comes from the lab's PyPI mirror
(what `invoke lab.build` downloads), installed once per run into a temporary directory; without the wheel
those tests skip, saying so."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from pdfleet.bench.launch import RouterProcess, SimProcess
from pdfleet.bench.procs import free_port
from pdfleet.errors import ValidationError
from pdfleet.lab.paths import LabPaths
from pdfleet.metrics.scrape import scrape_metrics
from pdfleet.sim.kv_library import (
    BUFFER_BYTES,
    WORD,
    LibraryError,
    LibrarySettings,
    NixlAgent,
    Offer,
    mismatch,
    region_offset,
    scaled,
    settings_from_env,
)
from tests.unit.sim.helpers import (
    KV_BYTES_8B,
    MODEL,
    kv_config,
    library_bytes,
    library_env,
    library_pair,
    post_json,
    stream_chats,
)

pytestmark = pytest.mark.procs  # pip installs the wheel; the simulators and the router are processes
# UCX listens on every interface it uses: on loopback alone here, as everything a test runs must
LOOPBACK_ONLY = "lo"


# ---- pure ---------------------------------------------------------------------------------------------


def test_the_library_is_off_unless_kv_transfer_env_names_it() -> None:
    assert settings_from_env({}) is None
    env = {"PDFLEET_SIM_KV_LIBRARY": "nixl", "PDFLEET_SIM_KV_BYTES_FRACTION": "0.001"}
    assert settings_from_env(env) == LibrarySettings("nixl", 0.001)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PDFLEET_SIM_KV_LIBRARY": "ucx"}, "PDFLEET_SIM_KV_LIBRARY='ucx': the simulator moves KV with nixl"),
        ({"PDFLEET_SIM_KV_LIBRARY": "nixl"}, "PDFLEET_SIM_KV_BYTES_FRACTION='': want a number in"),
        ({"PDFLEET_SIM_KV_LIBRARY": "nixl", "PDFLEET_SIM_KV_BYTES_FRACTION": "2"}, "FRACTION='2': want"),
        ({"PDFLEET_SIM_KV_LIBRARY": "nixl", "PDFLEET_SIM_KV_BYTES_FRACTION": "0"}, "FRACTION='0': want"),
    ],
)
def test_a_bad_library_setting_is_refused_naming_it(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        settings_from_env(env)


def test_blocks_are_scaled_whole_words_and_fit_the_buffer() -> None:
    # a 9K-token prompt of a 70B model (320 KiB a token) at 0.001: 576 blocks of 5240 bytes, ~3 MB
    assert scaled(9216 * 327680, 576, 0.001, BUFFER_BYTES) == 5240
    assert scaled(100, 1, 0.001, BUFFER_BYTES) == WORD  # never less than a word a block
    assert scaled(1 << 40, 4, 1.0, BUFFER_BYTES) == BUFFER_BYTES // 4  # never past the buffer
    assert scaled(1000, 0, 0.5, BUFFER_BYTES) == 0


def test_a_region_lies_in_the_buffer_on_a_word() -> None:
    for key in ("a", "b-0", "cmpl-123"):
        offset = region_offset(key, 4096, 1 << 20)
        assert offset % WORD == 0 and 0 <= offset <= (1 << 20) - 4096
    assert region_offset("x", 1 << 20, 1 << 20) == 0


def test_an_offer_crosses_the_side_channel_and_names_the_blocks_past_a_cache_hit() -> None:
    offer = Offer("bWV0YQ==", 4096, 800, 64, 5)
    assert Offer.from_wire(offer.to_wire()) == offer
    assert Offer.from_wire(None) is None and Offer.from_wire({"metadata": "m"}) is None
    assert offer.blocks_to_read(5) == [800, 864, 928, 992, 1056]
    assert offer.blocks_to_read(2) == [992, 1056]  # the consumer's own cache held the first three


def test_words_read_from_elsewhere_are_named() -> None:
    words = np.arange(100, 116, dtype=np.uint64)  # two blocks of 64 bytes, read from offsets 800 and 864
    assert mismatch(words, [800, 864], 64) is None
    assert (
        mismatch(words, [800, 872], 64) == "block 1 (remote offset 872) holds other bytes than the producer's"
    )


# ---- the real library ---------------------------------------------------------------------------------


def _thread_cpu() -> dict[int, float]:
    """CPU seconds (user + system) of each of this process's threads, by thread id (/proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            out[int(task.name)] = (int(fields[11]) + int(fields[12])) / tick
    return out


@pytest.fixture(scope="module")
def nixl_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A directory holding NIXL's CPU build (the lab mirror's nixl-cu12 wheel, --no-deps), for PYTHONPATH."""
    wheels = sorted((LabPaths().pypi_dir / "packages").glob("nixl_cu12-*-cp311-*.whl"))
    if not wheels or sys.version_info[:2] != (3, 11):
        pytest.skip(
            f"no nixl-cu12 cp311 wheel in {LabPaths().pypi_dir}/packages (invoke lab.build downloads it)"
        )
    target = tmp_path_factory.mktemp("nixl")
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target", str(target)]
    subprocess.run([*cmd, str(wheels[-1])], check=True, capture_output=True, timeout=300)
    return str(target)


def nixl_env(nixl_path: str) -> dict[str, str]:
    """A simulator's environment moving KV bytes through NIXL, its UCX on TCP over loopback (lab-cross's)."""
    return library_env("nixl", nixl_path, UCX_TLS="tcp", UCX_NET_DEVICES=LOOPBACK_ONLY)


@pytest.fixture
def nixl(nixl_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """NIXL importable in this process, over UCX's TCP transport (as lab-cross renders UCX_TLS)."""
    monkeypatch.syspath_prepend(nixl_path)
    monkeypatch.setenv("UCX_TLS", "tcp")
    monkeypatch.setenv("UCX_NET_DEVICES", LOOPBACK_ONLY)


def test_two_agents_move_the_blocks_and_the_library_s_errors_fail_the_read(nixl: None) -> None:
    settings = LibrarySettings("nixl", 0.01, buffer_bytes=1 << 20)

    async def run() -> tuple[int, str, str, float]:
        producer, consumer = NixlAgent("test-p", settings), NixlAgent("test-d", settings)
        try:
            threads = _thread_cpu()
            await producer.start(producer=True)
            await consumer.start(producer=False)
            started = {tid: cpu for tid, cpu in _thread_cpu().items() if tid not in threads}
            await asyncio.sleep(1.0)  # both agents idle: their threads (NIXL's progress threads among them)
            idle_cpu = sum(cpu - started[tid] for tid, cpu in _thread_cpu().items() if tid in started)
            offer = producer.offer("req-1", 500 * KV_BYTES_8B, 32)
            moved = await consumer.read(offer, 12, "req-1")
            with pytest.raises(LibraryError) as bad_agent:
                await consumer.read(Offer("bm90IG1ldGFkYXRh", offer.base, 0, 64, 1), 1, "req-2")
            outside = Offer(offer.metadata, offer.base + (2 << 20), 0, 64, 1)  # past the registered buffer
            with pytest.raises(LibraryError) as bad_read:
                await consumer.read(outside, 1, "req-3")
            notified = 0
            # the READ's notification reaches the producer's agent (vLLM frees on it): up to 30 s, as
            # niced beside the lab, this process and NIXL's threads can be starved for seconds
            for _ in range(3000):
                notified += await producer.drain_notifications()
                if notified:
                    break
                await asyncio.sleep(0.01)
            assert notified == 1
            return (
                moved,
                f"{bad_agent.value.handshake} {bad_agent.value}",
                f"{bad_read.value.handshake} {bad_read.value}",
                idle_cpu,
            )
        finally:
            producer.close()
            consumer.close()

    moved, bad_agent, bad_read, idle_cpu = asyncio.run(run())
    # the raised errors' tracebacks hold both agents in a reference cycle, and each agent's progress thread
    # lives until its agent is destroyed: collected now, not at this test process's next full collection
    gc.collect()
    # NIXL's progress threads wait for UCX's events (kv_library.PROGRESS_DELAY_US), not spin: 0.9 CPU-s a
    # second for the two with nixl_agent's own setting; a loaded machine can only lower it
    assert idle_cpu < 0.1, f"the idle agents' threads took {idle_cpu:.2f} CPU-s in 1 s"
    # the 12 blocks past a 20-block cache hit, each 0.01 of a block's 500 * 128 KiB / 32 in whole words
    assert moved == 12 * scaled(500 * KV_BYTES_8B, 32, 0.01, 1 << 20)
    assert bad_agent.startswith("True add_remote_agent: "), bad_agent  # a failed handshake, NIXL's words
    assert bad_read.startswith("False "), bad_read  # the READ itself refused


@pytest.fixture
def nixl_pair(nixl_path: str) -> Iterator[tuple[SimProcess, SimProcess]]:
    """A producer and a consumer simulator with the library on, their UCX on TCP (as lab-cross's env).
    One test's (its only user): the pair stops when that test ends, not with the module."""
    side = {"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())}
    with library_pair("NixlConnector", nixl_env(nixl_path), side) as pair:
        yield pair


def test_streamed_requests_through_the_router_move_their_bytes_through_nixl(
    nixl_pair: tuple[SimProcess, SimProcess],
) -> None:
    producer, consumer = nixl_pair
    before = scrape_metrics(consumer.url)
    with RouterProcess([producer.url], [consumer.url]) as router:
        usages = stream_chats(router.url)
    after = scrape_metrics(consumer.url)
    assert after["vllm:nixl_bytes_transferred_count"] - before["vllm:nixl_bytes_transferred_count"] == 3
    # the decode side counts the bytes NIXL moved: each request's blocks at 0.01 of their KV bytes
    moved = after["vllm:nixl_bytes_transferred_sum"] - before["vllm:nixl_bytes_transferred_sum"]
    assert moved == library_bytes(usages)
    failed = "vllm:nixl_num_failed_transfers_total"
    assert after[failed] == before[failed]
    # the library's own lines, each side's agent (NIXL's logger, not the simulator's)
    for proc in (producer, consumer):
        assert "NIXL INFO" in proc.log() and "Initialized NIXL agent: pdfleet-sim-" in proc.log()
    assert "KV bytes move through NIXL (UCX), 0.01 of each request's KV bytes" in consumer.log()


def test_a_consumer_with_the_library_cannot_read_a_producer_without_it(nixl_path: str) -> None:
    """The producer offers no agent: the handshake fails, the blocks are invalid, and 0.33's
    kv_load_failure_policy (fail) fails the request as vLLM's connector does."""
    side = free_port()
    common = ["--sim-time-scale", "0.1"]
    producer = SimProcess(
        [MODEL, *common, "--kv-transfer-config", kv_config("kv_producer")],
        env={"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side)},
    )
    consumer = SimProcess(
        [MODEL, *common, "--kv-transfer-config", kv_config("kv_consumer")],
        env=nixl_env(nixl_path),
        timeout=60,
    )
    with producer as p, consumer as d:
        prefill = {
            "model": MODEL,
            "prompt": "q" * 2000,
            "max_tokens": 1,
            "kv_transfer_params": {"do_remote_decode": True},
        }
        status, out = post_json(p.url + "/v1/completions", prefill)
        assert status == 200
        body = {
            "model": MODEL,
            "prompt": "q" * 2000,
            "max_tokens": 2,
            "kv_transfer_params": out["kv_transfer_params"],
        }
        status, err = post_json(d.url + "/v1/completions", body)
        assert status == 500 and "KV transfer" in err["error"]["message"], err
        assert scrape_metrics(d.url)["vllm:nixl_num_failed_transfers_total"] == 1
        assert "Handshake failed for request" in d.log() and "offers no NIXL agent" in d.log()

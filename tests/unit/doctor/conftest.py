"""A real client-side fleet on loopback for the doctor's client view: the gateway in front of one simulator
(alias `llama`), a bare simulator (a pool port) and one guarded by vLLM's own --api-key."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pdfleet.bench.launch import SimProcess
from pdfleet.gateway.app import Gateway, Running, start
from pdfleet.gateway.policy import load_policy
from tests.unit.doctor.helpers import VLLM_LOCAL_KEY, ClientFleet
from tests.unit.gateway.helpers import LoopThread, policy_dict, write_policy
from tests.unit.sim.helpers import MODEL


@pytest.fixture(scope="session")
def client_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClientFleet]:
    """Start the three servers once for every doctor test."""
    common = [MODEL, "--served-model-name", "llama", "--sim-time-scale", "0.02"]
    tmp = tmp_path_factory.mktemp("doctor")
    loop = LoopThread()
    with SimProcess(common) as pool, SimProcess([*common, "--api-key", VLLM_LOCAL_KEY]) as guarded:
        path = write_policy(tmp, policy_dict([pool.url], None))

        async def up() -> Running:
            return await start(Gateway(path, load_policy(path), shutdown_timeout=5))

        running: Running = loop.run(up)
        try:
            yield ClientFleet(running.port, pool.url, guarded.url)
        finally:
            loop.run(running.close)
            loop.close()

"""A whole pdfleet fleet on loopback for `invoke bench`'s own checks: simulators, vllm-router, the gateway.

`colocated` simulators behind the gateway's round robin, a prefill + decode pair behind the real
`vllm-router` (P/D mode), and `pdfleet-gateway` in front of both with one client key, so that a bench
run here goes through exactly the path it takes on a fleet. `LocalFleet.targets()` gives the metrics
endpoints with the labels the topology gives them (pool, role, host).

    with LocalFleet(colocated=2, sim_args=["--sim-time-scale", "1"]) as fleet:
        fleet.gateway  # pdfleet.bench.load.Gateway
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from pdfleet.bench.launch import RouterProcess, SimProcess
from pdfleet.bench.load import Gateway
from pdfleet.bench.procs import free_port, wait_http
from pdfleet.bench.workloads import SIM_MODEL
from pdfleet.gateway.keys import hash_key
from pdfleet.gateway.policy import policy_text, write_policy
from pdfleet.metrics.direct import Target

KEY = "sk-pdfleet-local-bench"  # this loopback fleet's own client key (hashed into its keys file)
KV = '{"kv_connector":"NixlConnector","kv_role":"%s"}'


class LocalFleet:
    """Start everything on enter (stopping what started if a later part fails), stop it all on exit."""

    def __init__(
        self,
        colocated: int = 2,
        sim_args: Sequence[str] = (),
        with_disagg: bool = True,
        link: str = "roce-400g",
        long_tokens: int = 8192,
        colocated_budget: int = 8192,
        policy: dict[str, Any] | None = None,
    ) -> None:
        self.n_colo, self.sim_args, self.with_disagg = colocated, list(sim_args), with_disagg
        self.link, self.long_tokens, self.budget = link, long_tokens, colocated_budget
        self.policy = policy or {}  # top-level policy keys over the fleet's own (stage, stages, decider...)
        self.stack = contextlib.ExitStack()
        self.colo: list[SimProcess] = []
        self.prefill: SimProcess | None = None
        self.decode: SimProcess | None = None
        self.router: RouterProcess | None = None
        self.tmp = Path(tempfile.mkdtemp(prefix="pdfleet-local-fleet-"))
        self.gateway_proc: subprocess.Popen[bytes] | None = None
        self.gateway = Gateway("127.0.0.1", 0, KEY, SIM_MODEL)

    def _sim(self, extra: Sequence[str], env: dict[str, str] | None = None) -> SimProcess:
        """A simulator started within the fleet's exit stack."""
        args = [SIM_MODEL, "--disable-log-stats", *self.sim_args, *extra]
        return self.stack.enter_context(SimProcess(args, env=env, timeout=60))

    def __enter__(self) -> LocalFleet:
        try:
            budget = ["--max-num-batched-tokens", str(self.budget)]
            self.colo = [self._sim(budget) for _ in range(self.n_colo)]
            if self.with_disagg:
                side = free_port()
                self.prefill = self._sim(
                    ["--max-num-batched-tokens", "8192", "--kv-transfer-config", KV % "kv_producer"],
                    env={
                        "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
                        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side),
                    },
                )
                self.decode = self._sim(
                    [
                        "--max-num-batched-tokens",
                        "2048",
                        "--sim-link",
                        self.link,
                        "--kv-transfer-config",
                        KV % "kv_consumer",
                    ]
                )
                self.router = self.stack.enter_context(RouterProcess([self.prefill.url], [self.decode.url]))
            self._start_gateway()
        except BaseException:
            self.stack.close()
            raise
        return self

    def _start_gateway(self) -> None:
        """pdfleet-gateway with this fleet's policy and key, once its /health answers."""
        port = free_port()
        keys = self.tmp / "keys.yaml"
        keys.write_text(f"keys:\n  - name: bench\n    sha256: {hash_key(KEY)}\n")
        os.chmod(keys, 0o600)
        route: dict[str, Any] = {"colocated": [s.url for s in self.colo]}
        if self.router:
            route["disagg"] = self.router.url
        policy = self.tmp / "policy.yaml"
        doc = {
            "version": 1,
            "listen": {"host": "127.0.0.1", "port": port},
            "keys_file": str(keys),
            "models": {SIM_MODEL: route},
            "long_prompt_tokens": self.long_tokens,
            "stage": "colocated",
            "stages": {"colocated": {"short": 0, "long": 0}},
            "log_requests": False,
            **self.policy,
        }
        write_policy(policy, policy_text(doc, policy))
        log = (self.tmp / "gateway.log").open("wb")
        self.stack.callback(log.close)
        self.gateway_proc = subprocess.Popen(
            [sys.executable, "-m", "pdfleet.gateway.cli", "--config", str(policy), "--log-level", "WARNING"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.stack.callback(self._stop_gateway)
        wait_http(f"http://127.0.0.1:{port}/health", 30, self.gateway_proc, self.tmp / "gateway.log")
        self.gateway = Gateway("127.0.0.1", port, KEY, SIM_MODEL)

    def _stop_gateway(self) -> None:
        """SIGTERM, then SIGKILL after 15 s."""
        proc = self.gateway_proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stack.close()

    def gpus(self, pool: str) -> int:
        """GPUs of a pool: one per simulator."""
        return self.n_colo if pool == "colocated" else (2 if self.with_disagg else 0)

    def targets(self, pool: str) -> list[Target]:
        """The metrics endpoints of a pool's instances, labelled as the topology labels them."""
        if pool == "colocated":
            return [
                Target(s.url + "/metrics", {"pool": "colocated", "role": "colocated", "host": f"colo{i + 1}"})
                for i, s in enumerate(self.colo)
            ]
        out = []
        for role, sim in (("prefill", self.prefill), ("decode", self.decode)):
            if sim is not None:
                out.append(Target(sim.url + "/metrics", {"pool": "disagg", "role": role, "host": role}))
        return out

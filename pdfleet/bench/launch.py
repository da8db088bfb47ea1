"""Start `pdfleet-sim serve` (and `vllm-router`) as real subprocesses on loopback, for tests and benches.

with SimProcess(["meta-llama/Llama-3.1-8B-Instruct", "--sim-time-scale", "0.1"]) as sim:
    httpx.get(sim.url + "/health")
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from pdfleet.bench.procs import free_port, pin, wait_http
from pdfleet.model.specs import RouterPolicy


class _Proc:
    """A subprocess with its output in a temp file, stopped (SIGTERM, then SIGKILL) on exit."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None,
        health_url: str,
        timeout: float,
        cpu: int | None = None,
    ) -> None:
        self.argv = list(argv)
        self.env = {**os.environ, **(env or {})}
        self.health_url = health_url
        self.timeout = timeout
        self.cpu = cpu
        self._logfile = tempfile.NamedTemporaryFile(  # noqa: SIM115 - kept open for the child's lifetime
            prefix="pdfleet-sim-", suffix=".log", delete=False, dir=os.environ.get("PDFLEET_SIM_LOG_DIR")
        )
        self.log_path = Path(self._logfile.name)
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Self:
        self.proc = subprocess.Popen(
            self.argv, env=self.env, stdout=self._logfile, stderr=subprocess.STDOUT, preexec_fn=pin(self.cpu)
        )
        try:
            wait_http(self.health_url, self.timeout, self.proc, self.log_path)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def stop(self) -> None:
        """Terminate the process (SIGKILL after 10 s) and close its log."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._logfile.close()

    def log(self) -> str:
        """What the process wrote so far (stdout and stderr)."""
        return self.log_path.read_text()


class SimProcess(_Proc):
    """`pdfleet-sim serve ARGS --host 127.0.0.1 --port P` from this interpreter's environment."""

    def __init__(
        self,
        args: Sequence[str],
        env: Mapping[str, str] | None = None,
        port: int | None = None,
        timeout: float = 30.0,
        cpu: int | None = None,
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [
            sys.executable,
            "-m",
            "pdfleet.sim.cli",
            "serve",
            *args,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        super().__init__(argv, env, self.url + "/health", timeout, cpu)


class RouterProcess(_Proc):
    """The real `vllm-router` in P/D mode over the given prefill and decode URLs, on loopback, selecting
    workers by `policy` (default: the profile's default, round_robin), never the router's own default."""

    def __init__(
        self,
        prefill: Sequence[str],
        decode: Sequence[str],
        port: int | None = None,
        timeout: float = 60.0,
        extra: Sequence[str] = (),
        kv_connector: str = "nixl",
        bootstrap_ports: Sequence[int] = (),
        policy: RouterPolicy | None = None,
    ) -> None:
        self.port = port or free_port()
        self.policy = policy or RouterPolicy()  # the profile's default, as a provisioned unit renders it
        self.url = f"http://127.0.0.1:{self.port}"
        exe = Path(sys.executable).with_name("vllm-router")
        argv = [str(exe), "--vllm-pd-disaggregation"]
        for i, url in enumerate(prefill):  # `--prefill URL BOOTSTRAP_PORT` for mooncake
            argv += ["--prefill", url, *([str(bootstrap_ports[i])] if i < len(bootstrap_ports) else [])]
        for url in decode:
            argv += ["--decode", url]
        argv += [
            "--kv-connector",
            kv_connector,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            str(free_port()),
            *self.policy.argv(),
            *extra,
        ]
        super().__init__(argv, None, self.url + "/health", timeout)

"""A small real fleet on 127.0.0.1 for the controller's tests: simulators as the pools, real
`pdfleet-gateway` processes in front of them, a real Prometheus scraping the gateways, and a load
generator that counts every request that does not end in a 200 with its stream complete."""

from __future__ import annotations

import contextlib
import http.client
import itertools
import json
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pdfleet.bench.launch import _Proc
from pdfleet.bench.procs import free_port
from pdfleet.gateway.keys import hash_key
from pdfleet.gateway.policy import policy_text, write_policy
from pdfleet.metrics.prometheus import PrometheusClient
from pdfleet.rollout.config import ControllerConfig, GatewayTarget
from pdfleet.rollout.controller import Controller
from pdfleet.rollout.gateways import GatewayClient
from pdfleet.rollout.store import Store
from tests.unit.metrics.helpers import prometheus, scrape_config
from tests.unit.metrics.helpers import wait_until as wait_until  # the rollout tests' name for it

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
USER_KEY = "sk-user-rollout-0123456789"
ADMIN_KEY = "sk-admin-rollout-9876543210"
LONG_TOKENS = 256
STAGES = {"colocated": {"short": 0, "long": 0}, "long-prompts": {"short": 0, "long": 100}}
SLO = {"ttft_p99_ms": 60000.0, "tpot_p99_ms": 1000.0, "itl_p99_ms": 5000.0, "kv_transfer_p99_ms": 5000.0}


SHARED = ("profile", "gateways", "prometheus_url", "stage_key_file", "state_dir")


class GatewayProcess(_Proc):
    """`pdfleet-gateway --config POLICY` as a real process on a given loopback port."""

    def __init__(
        self, directory: Path, port: int, colocated: str, disagg: str, small: str | None = None
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        keys = directory / "keys.yaml"
        entries = [
            {"name": "user", "sha256": hash_key(USER_KEY)},
            {"name": "admin", "sha256": hash_key(ADMIN_KEY), "admin": True},
        ]
        keys.write_text(yaml.safe_dump({"keys": entries}))
        keys.chmod(0o600)
        self.policy = directory / "policy.yaml"
        doc = {
            "version": 1,
            "listen": {"host": "127.0.0.1", "port": port},
            "keys_file": "keys.yaml",
            "models": {"llama": {"colocated": [colocated], "disagg": disagg}},
            **(two_models(colocated, disagg, small) if small else {}),
            "long_prompt_tokens": LONG_TOKENS,
            "stage": "colocated",
            "stages": STAGES,
            "timeouts": {"connect_s": 1, "first_byte_s": 20, "idle_s": 20},
            "log_requests": False,
        }
        write_policy(self.policy, policy_text(doc, self.policy))
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        argv = [
            sys.executable,
            "-m",
            "pdfleet.gateway.cli",
            "--config",
            str(self.policy),
            "--shutdown-timeout",
            "2",
        ]
        super().__init__(argv, None, self.url + "/health", 30.0)


def two_models(colocated: str, disagg: str, small: str) -> dict[str, Any]:
    """A policy's groups and aliases for two models, as provision renders a `models:` profile: `llama`
    follows the top-level stage, `small` (colocated and P/D pools of its own) carries its own."""
    return {
        "groups": {"llama": {}, "small": {"stage": "colocated", "stages": STAGES}},
        "models": {
            "llama": {"colocated": [colocated], "disagg": disagg, "group": "llama"},
            "small": {"colocated": [small], "disagg": small, "group": "small"},
        },
    }


@dataclass
class Load:
    """Streaming chat requests through the gateways from a few threads, long and short prompts, each
    with its own session (so sticky buckets spread); `failed` counts anything but a whole 200 stream."""

    ports: list[int]
    threads: int = 4
    pace_s: float = 0.0  # each thread's rest between requests (0: closed loop, as fast as answered)
    sent: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _workers: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Load:
        counter = itertools.count()
        for _ in range(self.threads):
            t = threading.Thread(target=self._work, args=(counter,), daemon=True)
            t.start()
            self._workers.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._workers:
            t.join(30)

    def _work(self, counter: Any) -> None:
        while not self._stop.is_set():
            n = next(counter)
            long = n % 2 == 0
            text = ("word " * (LONG_TOKENS * 2)) if long else "hello there"
            ok, why = self._one(self.ports[n % len(self.ports)], text, f"session-{n}")
            with self._lock:
                self.sent += 1
                if not ok:
                    self.failed += 1
                    self.errors.append(why)
            if self.pace_s:
                self._stop.wait(self.pace_s)

    def _one(self, port: int, text: str, session: str) -> tuple[bool, str]:
        body = json.dumps(
            {
                "model": "llama",
                "messages": [{"role": "user", "content": text}],
                "stream": True,
                "max_tokens": 4,
            }
        )
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            conn.request(
                "POST",
                "/v1/chat/completions",
                body,
                {
                    "Authorization": f"Bearer {USER_KEY}",
                    "Content-Type": "application/json",
                    "X-Session-Id": session,
                },
            )
            resp = conn.getresponse()
            raw = resp.read()
            if resp.status != 200 or b"[DONE]" not in raw:
                return False, f"{resp.status}: {raw[:200]!r}"
            return True, ""
        except (OSError, http.client.HTTPException) as exc:
            return False, repr(exc)
        finally:
            conn.close()


@dataclass
class Fleet:
    gateways: list[GatewayProcess]
    prom: Any
    state_dir: Path

    def config(self, rollout: dict[str, Any], **more: Any) -> dict[str, Any]:
        """The controller's configuration over this fleet (`more` overrides any key)."""
        key = self.state_dir.parent / "admin.key"
        key.write_text(ADMIN_KEY)
        key.chmod(0o600)
        return {
            "profile": "test",
            "rollout": rollout,
            "stages": STAGES,
            "initial_stage": "colocated",
            "slo": SLO,
            "gateways": [{"name": f"gw{i}", "admin_url": g.url} for i, g in enumerate(self.gateways)],
            "prometheus_url": self.prom.url,
            "stage_key_file": str(key),
            "state_dir": str(self.state_dir),
            "kv_transfer_metrics": False,
            **more,
        }

    def controller(self, rollout: dict[str, Any], **more: Any) -> Controller:
        """One model's controller (`name` in `more`: its state under state_dir/<name>, as
        pdfleet-rollout keeps it)."""
        config = ControllerConfig.model_validate(self.config(rollout, **more))
        return Controller(
            config,
            PrometheusClient(config.prometheus_url, timeout=2.0),
            GatewayClient(ADMIN_KEY, 2.0),
            Store(Path(config.state_dir) / (config.name or "")),
        )

    def file(self, models: list[dict[str, Any]]) -> dict[str, Any]:
        """controller.json over this fleet: each of `models` is one model's part (name, rollout, ...)."""
        flat = self.config({})
        shared = {k: flat.pop(k) for k in SHARED}
        return {**shared, "models": [{**flat, **m} for m in models]}

    def reports(self, controller: Controller, group: str | None = None) -> list[Any]:
        """Every gateway's report of the top-level stage (or of a model group)."""
        return [
            controller.gateways.report(GatewayTarget(name=f"gw{i}", admin_url=g.url), group)
            for i, g in enumerate(self.gateways)
        ]


@contextmanager
def fleet(
    tmp: Path, colocated: str, disagg: str, gateways: int = 2, small: str | None = None
) -> Iterator[Fleet]:
    """`gateways` gateway processes over the two pools (and a second model's on `small`: two_models)
    and a Prometheus scraping them every second."""
    ports = [free_port() for _ in range(gateways)]
    targets = [(f"127.0.0.1:{p}", {"role": "gateway", "host": f"gw{i}"}) for i, p in enumerate(ports)]
    with ExitStack() as stack:
        procs = [
            stack.enter_context(GatewayProcess(tmp / f"gw{i}", p, colocated, disagg, small))
            for i, p in enumerate(ports)
        ]
        prom = stack.enter_context(prometheus(tmp / "prom", scrape_config(targets, interval_s=1)))
        yield Fleet(procs, prom, tmp / "state")


@contextmanager
def hung_server() -> Iterator[str]:
    """An HTTP server on loopback that accepts every connection and never answers (a hung Prometheus)."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                held.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        for conn in [*held, listener]:
            conn.close()


@contextmanager
def running(controller: Controller) -> Iterator[Controller]:
    """The controller's loop in a thread for the block, stopped at its end."""
    stop = threading.Event()
    thread = threading.Thread(target=controller.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield controller
    finally:
        stop.set()
        thread.join(10)

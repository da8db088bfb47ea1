"""What lab tests share: the repo root, the running lab as tests see it, and (below) the probes and the
streamed traffic of the rebalance tests."""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import random
import shutil
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pdfleet.bench.client import Record, StreamClient, request_bytes
from pdfleet.bench.workloads import completion_body, words
from pdfleet.fleet.deployment import Deployment, DeploymentRequest, load_deployment
from pdfleet.fleet.roles import Role
from pdfleet.gateway.tls import client_context
from pdfleet.lab.control import Lab, up
from pdfleet.lab.hosts import LabHost, ssh_run
from pdfleet.lab.paths import LabPaths
from pdfleet.metrics.scrape import scrape_metrics
from pdfleet.model.inventory import Inventory, load_inventory
from pdfleet.model.monitoring import MonitoringSpec

REPO_ROOT = Path(__file__).resolve().parents[2]
LAB_INVENTORY = "inventory/lab.yml"
INVOKE = (sys.executable, "-m", "invoke")


@dataclass(frozen=True)
class LabHandle:
    """The running lab as tests see it."""

    lab: Lab
    hosts: tuple[LabHost, ...]

    @property
    def paths(self) -> LabPaths:
        return self.lab.paths

    @property
    def inventory(self) -> Inventory:
        return load_inventory(self.lab.inventory)

    def ssh(self, host: LabHost, command: str, timeout: float = 60.0) -> tuple[int, str, str]:
        """Run a command on a lab host as the lab user (strict host-key checking)."""
        return ssh_run(host.address, self.paths.key_file, self.paths.known_hosts, command, timeout)

    def up(self) -> None:
        """Bring the lab (back) up; cheap when it is already running."""
        up(self.lab)


@dataclass
class LabCrossOwed:
    """lab-cross owed back: a module of SWITCHING (tests/lab/conftest.py) that provisions another profile
    sets `owed` instead of provisioning lab-cross back itself; the next test sharing lab-cross gets it."""

    owed: bool = False


def prometheus_url(profile: str, inventory: str = LAB_INVENTORY) -> str:
    """The Prometheus bench, doctor and monitor must read for a lab profile: the topology's (lab-gw on the
    profile's monitoring.port), not on Prometheus's default port, so a task reading a fixed one misses it."""
    topology = lab_deployment(profile, inventory=inventory).topology
    assert topology.prometheus is not None, f"{profile}: the lab inventory has no monitoring host"
    default = MonitoringSpec.model_fields["port"].default
    assert topology.prometheus.port != default, (
        f"{profile}: set monitoring.port to a port other than {default}"
    )
    return topology.prometheus.url


def derived_profile(tmp_path: Path, name: str, text: str) -> str:
    """A profile `name` (YAML `text`, extending one of the repo's) written beside a copy of the repo's
    profiles under `tmp_path`; its path, for `--profile`."""
    profiles = tmp_path / "profiles"
    shutil.copytree(REPO_ROOT / "profiles", profiles)
    (profiles / f"{name}.yml").write_text(text)
    return str(profiles / f"{name}.yml")


def lab_deployment(
    profile: str,
    roles: tuple[Role, ...] = (),
    inventory: str = LAB_INVENTORY,
    layout: Mapping[str, tuple[str, ...]] | None = None,
) -> Deployment:
    """A lab profile on a lab inventory (inventory/lab.yml unless given), through the one door the tasks use;
    with `layout` (host -> its pools), the topology of that live layout."""
    request = DeploymentRequest(
        profile,
        REPO_ROOT / inventory,
        REPO_ROOT / "profiles",
        REPO_ROOT / "templates",
        roles,
        layout=None if layout is None else ("a lab test", layout),
    )
    return load_deployment(request)


def gateway_url(profile: str = "lab-cross") -> str:
    """The first gateway's client URL from the profile's topology (https under gateway.tls, with its CA)."""
    return lab_deployment(profile).topology.gateways[0].url


def gateway_open(
    target: str | urllib.request.Request, profile: str = "lab-cross", timeout: float = 10.0
) -> bytes:
    """GET or POST `target` (a gateway URL) verifying the gateway against the topology's CA; the body."""
    ctx = client_context(lab_deployment(profile).topology.gateways[0].ca_file)
    with urllib.request.urlopen(target, timeout=timeout, context=ctx) as resp:  # noqa: S310 (a lab URL)
        body: bytes = resp.read()
        return body


def lab_env(profile: str | None = None) -> dict[str, str]:
    """What `eval "$(invoke lab.env [--profile P])"` exports, parsed (the SDKs' URLs, key, SSL_CERT_FILE);
    asked again only when the lab's client key file changed (a lab brought down and up: a new key)."""
    key = LabPaths().gateway_client_key
    return dict(_lab_env(profile, key.stat().st_mtime_ns if key.exists() else 0))


@functools.cache
def _lab_env(profile: str | None, _key_stamp: int) -> dict[str, str]:
    args = [sys.executable, "-m", "invoke", "lab.env", *(["--profile", profile] if profile else [])]
    proc = subprocess.run(args, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    env = {}
    for line in proc.stdout.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = value.strip("'\"")
    return env


def sdk_verify(env: dict[str, str]) -> ssl.SSLContext | bool:
    """What an SDK given `env` as its environment trusts: SSL_CERT_FILE's CA, else the system's (True). For
    a client built with explicit arguments: `http_client=openai.DefaultHttpxClient(verify=...)`."""
    ca = env.get("SSL_CERT_FILE")
    return ssl.create_default_context(cafile=ca) if ca else True


# The probes and the traffic of the rebalance lab tests.


def invoke_ok(*args: str, timeout: float = 600) -> str:
    """`invoke ARGS` in the repo root, asserted to succeed (its outputs' tails when not); its stdout."""
    proc = subprocess.run(
        [*INVOKE, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout


def wait_for(check: Callable[[], Any], timeout: float, what: str, every: float = 1.0) -> Any:
    """`check()`'s first true answer within `timeout` seconds (an AssertionError naming `what` after)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def lab_host(lab: LabHandle, name: str) -> LabHost:
    """A running lab host by its inventory name."""
    return next(h for h in lab.hosts if h.name == name)


def remote_file(lab: LabHandle, host: str, path: str) -> str | None:
    """A file on a lab host, read as root (None: absent)."""
    rc, out, err = lab.ssh(lab_host(lab, host), f"sudo -n sh -c '[ -e {path} ] || exit 3; cat {path}'")
    assert rc in (0, 3), err
    return out if rc == 0 else None


def router_workers(lab: LabHandle, host: str, router_url: str) -> list[str]:
    """The workers vllm-router on a gateway host lists (`GET /list_workers` on its loopback)."""
    rc, out, err = lab.ssh(lab_host(lab, host), f"curl -sS -f {router_url}/list_workers")
    assert rc == 0, err
    return list(json.loads(out)["urls"])


def gateway_policy(lab: LabHandle, host: str, model: str) -> dict[str, Any]:
    """A model's section of the routing policy the gateway on a host runs (colocated, disagg, prefill)."""
    text = remote_file(lab, host, "/etc/pdfleet/gateway/policy.yaml")
    assert text is not None, f"{host}: no gateway policy"
    return dict(yaml.safe_load(text)["models"][model])


def scraped_roles(prometheus: str) -> dict[str, set[str]]:
    """Host -> the `role` labels of its vLLM targets Prometheus scrapes up now (a removed target is gone
    from the answer at once: Prometheus marks its series stale)."""
    query = urllib.parse.urlencode({"query": 'up{job="vllm"} == 1'})
    with urllib.request.urlopen(f"{prometheus}/api/v1/query?{query}", timeout=10) as resp:  # noqa: S310
        result = json.loads(resp.read())["data"]["result"]
    roles: dict[str, set[str]] = {}
    for series in result:
        roles.setdefault(series["metric"].get("host", ""), set()).add(series["metric"].get("role", ""))
    return roles


def served(url: str) -> float:
    """An instance's finished requests (vllm:request_success_total; 0 when its /metrics cannot be read)."""
    try:
        return scrape_metrics(url).get("vllm:request_success_total", 0.0)
    except OSError:
        return 0.0


def in_flight(url: str) -> float:
    """An instance's requests running or waiting (-1 when its /metrics cannot be read)."""
    try:
        metrics = scrape_metrics(url)
    except OSError:
        return -1.0
    return metrics.get("vllm:num_requests_running", 0.0) + metrics.get("vllm:num_requests_waiting", 0.0)


def at_drain(out: str) -> int:
    """How many requests `invoke rebalance` found in its host at the drain (its output's line)."""
    line = next(ln for ln in out.splitlines() if "at the drain" in ln)
    return int(line.split()[0])


@dataclass(frozen=True)
class GatewayTarget:
    """Where a stream is sent: a gateway's address, port, client key and TLS context (None: plain HTTP)."""

    host: str
    port: int
    key: str
    tls: ssl.SSLContext | None


def gateway_targets(profile: str, inventory: str = LAB_INVENTORY) -> list[GatewayTarget]:
    """Every gateway of a lab profile from its topology, with the lab's client key (as `invoke lab.env`)."""
    key = LabPaths().gateway_client_key.read_text().strip()
    gateways = lab_deployment(profile, inventory=inventory).topology.gateways
    return [GatewayTarget(g.address, g.port, key, client_context(g.ca_file)) for g in gateways]


@dataclass(frozen=True)
class Streams:
    """What StreamedTraffic keeps in flight: `long` streams of `long_tokens`-word prompts and `short` ones of
    16 words, each asking `long_out` / `short_out` tokens (ignoring EOS: the output is that long)."""

    model: str
    long_tokens: int
    long: int = 2
    short: int = 3
    long_out: int = 300
    short_out: int = 500
    seed: int = 35


@dataclass
class StreamedTraffic:
    """Streamed completions through gateways with the bench's client, from start() until stop(): each
    stream sends its next request as soon as its last one ended, the streams given to the gateways in turn;
    `ok` counts the successes and `failed` keeps every failure's error."""

    gateways: Sequence[GatewayTarget]
    streams: Streams
    ok: int = 0
    failed: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> StreamedTraffic:
        self._thread = threading.Thread(target=asyncio.run, args=(self._all(),), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sending; the requests in flight finish first (at most 120 s)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(120)

    async def _all(self) -> None:
        rng = random.Random(self.streams.seed)
        kinds = [True] * self.streams.long + [False] * self.streams.short
        targets = itertools.cycle(self.gateways)
        await asyncio.gather(*(self._stream(long, next(targets), rng) for long in kinds))

    async def _stream(self, long: bool, gateway: GatewayTarget, rng: random.Random) -> None:
        spec = self.streams
        client = StreamClient(gateway.host, gateway.port, tls=gateway.tls)
        try:
            for n in itertools.count():
                if self._stop.is_set():
                    return
                tokens = spec.long_out if long else spec.short_out
                prompt = words(spec.long_tokens if long else 16, rng)
                body = completion_body(prompt, tokens, spec.model, usage=True)
                rec = Record(n, "", "long" if long else "short", 0, tokens)
                path = "/v1/completions"
                await client.run(request_bytes(gateway.host, gateway.port, path, body, key=gateway.key), rec)
                if rec.success:
                    self.ok += 1
                else:
                    self.failed.append(rec.error or f"HTTP {rec.status}")
        finally:
            client.close()

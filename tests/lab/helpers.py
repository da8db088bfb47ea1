"""What lab tests share: the repo root and the running lab as tests see it."""

from __future__ import annotations

import functools
import shutil
import ssl
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from pdfleet.fleet.deployment import Deployment, DeploymentRequest, load_deployment
from pdfleet.fleet.roles import Role
from pdfleet.gateway.tls import client_context
from pdfleet.lab.control import Lab, up
from pdfleet.lab.hosts import LabHost, ssh_run
from pdfleet.lab.paths import LabPaths
from pdfleet.model.inventory import Inventory, load_inventory
from pdfleet.model.monitoring import MonitoringSpec

REPO_ROOT = Path(__file__).resolve().parents[2]


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


def prometheus_url(profile: str) -> str:
    """The Prometheus bench, doctor and monitor must read for a lab profile: the topology's (lab-gw on the
    profile's monitoring.port), not on Prometheus's default port, so a task reading a fixed one misses it."""
    topology = lab_deployment(profile).topology
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


def lab_deployment(profile: str, roles: tuple[Role, ...] = ()) -> Deployment:
    """A lab profile on inventory/lab.yml, through the one door the tasks use."""
    lab = REPO_ROOT / "inventory" / "lab.yml"
    return load_deployment(
        DeploymentRequest(profile, lab, REPO_ROOT / "profiles", REPO_ROOT / "templates", roles)
    )


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

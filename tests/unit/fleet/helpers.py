"""Shared pieces of the fleet tests."""

from __future__ import annotations

import ast
import dataclasses
import functools
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from pdfleet.errors import ValidationError
from pdfleet.fleet.deployment import Deployment, DeploymentRequest, load_deployment
from pdfleet.fleet.gateway_tls import placeholder_material
from pdfleet.fleet.mover import Layout, Left
from pdfleet.fleet.moving import MoveFailed
from pdfleet.fleet.roles import Role
from pdfleet.fleet.secrets import GatewaySecrets
from pdfleet.model.inventory import load_inventory
from pdfleet.model.inventory_checks import check_against_inventory
from pdfleet.model.profile_loader import list_profiles, load_profile
from pdfleet.model.tls import GatewayTls, GatewayTlsSetting
from roles import REGISTRY

REPO = Path(__file__).resolve().parents[3]
# Each shipped profile's example inventory.
EXAMPLES = {
    "colocated": "inventory/examples/colocated.yml",
    "same-host-pcie": "inventory/examples/same-host-pcie.yml",
    "cross-rdma": "inventory/examples/cross-rdma.yml",
}
# Fixed key hashes, so rendered files do not depend on the keys generated on this machine.
TEST_SECRETS = GatewaySecrets(client_sha256="1" * 64, admin_sha256="2" * 64)


def deploy(
    profile: str,
    inventory: Path,
    profiles: Path = REPO / "profiles",
    roles: Iterable[Role] = REGISTRY,
    secrets: GatewaySecrets | None = TEST_SECRETS,
) -> Deployment:
    """A deployment through the one door (every host), with these keys where its roles install keys."""
    request = DeploymentRequest(
        profile,
        inventory,
        profiles,
        REPO / "templates",
        tuple(roles),
        secrets=None if secrets is None else functools.partial(_with_tls, secrets),
    )
    return load_deployment(request)


def _with_tls(
    secrets: GatewaySecrets, _client: str, _admin: str, _outside: object, tls: GatewayTlsSetting, *_: str
) -> GatewaySecrets:
    """The test keys, and the profile's TLS files as `invoke render` shows them before they exist.

    Placeholders whether or not they exist here: the lab profiles name the lab's live PKI, which the lab
    session beside the unit phase makes and renews (a key read before a renewal, its certificate after,
    is a mismatched pair). A test that wants real files passes its own `secrets.tls`."""
    if secrets.tls is not None or not isinstance(tls, GatewayTls):
        return secrets
    return dataclasses.replace(secrets, tls=placeholder_material(tls))


def fleet_of(profile: str, inventory: Path | None = None) -> Deployment:
    """The deployment of a shipped profile on an inventory (default: its example), with the test keys."""
    return deploy(profile, inventory or REPO / EXAMPLES[profile])


def profile_inventory_pairs() -> list[tuple[str, Path]]:
    """Every (profile, inventory) in the repo that validates together: what an operator could deploy."""
    return list(_pairs())


@functools.cache
def _pairs() -> tuple[tuple[str, Path], ...]:
    """profile_inventory_pairs, worked out once per test process (six test modules ask at import)."""
    inventories = []
    for inv_path in sorted((REPO / "inventory").rglob("*.yml")):
        try:
            inventories.append((inv_path, load_inventory(inv_path)))
        except ValidationError:
            continue
    pairs = []
    for name in list_profiles(REPO / "profiles"):
        profile = load_profile(name, REPO / "profiles")
        for inv_path, inventory in inventories:
            try:
                check_against_inventory(profile, inventory)
            except ValidationError:
                continue
            pairs.append((name, inv_path))
    return tuple(pairs)


def third_party_imports(files: Iterable[Path]) -> set[str]:
    """Top-level names of the non-stdlib, non-pdfleet modules these files import."""
    found: set[str] = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return {name for name in found if name != "pdfleet" and name not in sys.stdlib_module_names}


def exported_series() -> set[str]:
    """Every series name the scrape targets export: the simulator in P/D mode (vLLM's names, NIXL too),
    the gateway, and the `up` Prometheus adds per target. Read from the real registries."""
    from pdfleet.gateway.metrics import GatewayMetrics
    from pdfleet.sim.config import parse_serve_args
    from pdfleet.sim.server import SimServer
    from tests.unit.sim.helpers import MODEL, kv_config

    sim = SimServer(parse_serve_args([MODEL, "--kv-transfer-config", kv_config("kv_consumer")], env={}))
    suffixes = {
        "counter": ("_total",),
        "histogram": ("_bucket", "_count", "_sum"),
        "info": ("_info",),
        "gauge": ("",),
    }
    names = {"up"}
    for registry in (sim.registry, GatewayMetrics().registry):
        for family in registry.collect():
            names |= {family.name + s for s in suffixes.get(family.type, ("",))}
    return names


_PROMQL_WORDS = {
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "inf",
    "nan",
}


def series_in(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (strings, matchers, ranges and grouping lists removed)."""
    import re

    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    found = set()
    for match in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", text):
        word = match.group(0)
        after = text[match.end() :].lstrip()
        if after.startswith("(") or word.lower() in _PROMQL_WORDS:
            continue
        if text[max(0, match.start() - 1)].isdigit() or re.fullmatch(r"e\d*", word):
            continue  # exponent of a number like 1e-9
        found.add(word)
    return found


def monitoring_on_port(tmp: Path, port: int) -> tuple[Path, Path, Path]:
    """lab-cross with `monitoring.port: port`, its monitoring host `mon` on 127.0.0.1 (the other lab hosts
    as they are, never contacted): (profiles dir, profile file, inventory file)."""
    profiles = tmp / "profiles"
    profiles.mkdir(parents=True)
    for source in (REPO / "profiles").glob("*.yml"):
        (profiles / source.name).write_text(source.read_text())
    profile = profiles / "mon-port.yml"
    profile.write_text(f"extends: lab-cross\nmonitoring:\n  port: {port}\n")
    lab = (REPO / "inventory" / "lab.yml").read_text()
    moved = lab.replace("    monitoring:\n      hosts:\n        lab-gw: {}\n", "")
    assert moved != lab, "inventory/lab.yml's monitoring group moved: update this helper"
    moved = moved.replace(
        "  children:\n",
        "  children:\n    monitoring:\n      hosts:\n        mon:\n          ansible_host: 127.0.0.1\n",
        1,
    )
    inventory = tmp / "inventory.yml"
    inventory.write_text(moved)
    return profiles, profile, inventory


TWO_PD = """\
extends: lab-cross
gateway:
  model_alias: null
models:
  - name: nixl-8b
    aliases: [nixl-8b]
    pools:
      prefill: {hosts: [lab-p1], tensor_parallel_size: 2, gpus: [0, 1]}
      decode: {hosts: [lab-d1]}
      colocated: {hosts: [lab-colo1]}
  - name: moon-8b
    aliases: [moon-8b]
    kv_transfer: {connector: MooncakeConnector, mooncake_protocol: tcp}
    gateway: {router_port: 8091, router_prometheus_port: 29001}
    pools:
      prefill: {hosts: [lab-p2]}
      decode: {hosts: [lab-d2]}
      colocated: {hosts: [lab-colo2]}
"""


def two_pd_deployment(tmp_path: Path) -> Deployment:
    """Two P/D models on the 16-host lab, each on its own hosts and connector: nixl-8b (NIXL, prefill TP 2
    on lab-p1, decode on lab-d1) and moon-8b (Mooncake over TCP, lab-p2 and lab-d2)."""
    path = tmp_path / "two-pd.yml"
    path.write_text(TWO_PD)
    return deploy(str(path), REPO / "inventory/lab-16.yml", secrets=None)


class Recorded:
    """A fleet that records each call; `busy` in-flight readings before 0, `health` answers before True."""

    def __init__(
        self, busy: list[int | Left | None] | None = None, healthy_after: int = 0, fail: str = ""
    ) -> None:
        self.calls: list[tuple[object, ...]] = []
        self.busy = list(busy or [])
        self.healthy_after = healthy_after
        self.fail = fail  # converge with these roles fails ("all": roles None)
        self.lines: list[str] = []

    def converge(self, layout: Layout, hosts: Sequence[str], roles: str | None) -> None:
        self.calls.append(("converge", dict(layout.hosts), tuple(hosts), roles))
        if self.fail and self.fail == (roles or "all"):
            raise MoveFailed(f"provisioning {', '.join(hosts)} failed: boom")

    def unroute(self, host: str, pool: str) -> None:
        self.calls.append(("unroute", host, pool))

    def left(self, host: str, pool: str) -> Left | None:
        self.calls.append(("left", host, pool))
        got = self.busy.pop(0) if self.busy else 0
        return Left(got) if isinstance(got, int) else got

    def healthy(self, host: str, pool: str) -> bool:
        self.calls.append(("healthy", host, pool))
        self.healthy_after -= 1
        return self.healthy_after < 0

    def keep(self, layout: Layout) -> None:
        self.calls.append(("keep", dict(layout.hosts)))

    def say(self, line: str) -> None:
        self.lines.append(line)


class Clock:
    """Time that moves only when the executor sleeps."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

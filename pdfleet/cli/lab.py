"""`invoke lab.*`: the local lab of systemd-nspawn hosts (see pdfleet.lab)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from invoke import Context, task
from invoke.exceptions import Exit

from pdfleet.cli.exits import user_errors
from pdfleet.cli.options import open_deployment
from pdfleet.cli.settings import REPO_ROOT
from pdfleet.errors import PdfleetError

if TYPE_CHECKING:  # imported when a task runs (pdfleet/cli/__init__.py)
    from rich.console import Console

    from pdfleet.lab.control import Lab

LAB_INVENTORY = "inventory/lab.yml"


INVENTORY_HELP = (
    "the lab inventory whose hosts to boot (default: the one lab.up last booted, else "
    f"{LAB_INVENTORY}); every ansible_host must be in 198.18.0.0/24"
)


def this_lab(inventory: str | None = None) -> Lab:
    """The lab of this clone: fixed state root, a mirror carrying every role's apt packages, and its
    inventory: the one given, else the one lab.up last booted, else inventory/lab.yml (never the
    invoke.yaml default)."""
    from pdfleet.fleet.roles import apt_packages
    from pdfleet.lab.control import Lab
    from pdfleet.lab.paths import LabPaths
    from pdfleet.lab.state import LabState
    from roles import REGISTRY

    paths = LabPaths()
    default = REPO_ROOT / LAB_INVENTORY
    if inventory:
        path = Path(inventory) if Path(inventory).is_absolute() else Path.cwd() / inventory
        if not path.is_file():
            raise PdfleetError(f"lab inventory {path} does not exist")
        return Lab(paths, path, apt_packages(REGISTRY))
    booted = LabState.load(paths.state_file).inventory
    # a booted inventory deleted since (a temporary one) must not stop lab.down or lab.status
    path = Path(booted) if booted and Path(booted).is_file() else default
    return Lab(paths, path, apt_packages(REGISTRY))


def lab_progress(console: Console) -> Callable[[str], None]:
    """Progress lines on stderr, so stdout stays clean for eval-able output."""
    return lambda message: console.print(f"[dim]lab:[/dim] {message}", highlight=False, soft_wrap=True)


@task(name="up", help={"inventory": INVENTORY_HELP.replace("the one lab.up last booted, else ", "")})
@user_errors
def up_task(c: Context, inventory: str | None = None) -> None:
    """Bring the lab up: image, mirrors, bridge, the inventory's hosts (others stopped); waits for SSH."""
    from rich.console import Console

    from pdfleet.lab.control import up

    console = Console(stderr=True)
    result = up(this_lab(inventory or str(REPO_ROOT / LAB_INVENTORY)), lab_progress(console))
    console.print(
        f"lab up in {result.seconds:.0f} s: {', '.join(h.name for h in result.hosts)}; "
        f"host wheel {result.host_version}"
    )
    _say_unavailable(console, result.apt_unavailable)


def _say_unavailable(console: Console, packages: tuple[str, ...]) -> None:
    """Name the apt packages the mirror could not get from Debian (the roles that need them will fail)."""
    if packages:
        console.print(f"apt mirror: not in Debian, not served: {', '.join(packages)}")


@task(name="build")
@user_errors
def build_task(c: Context) -> None:
    """Build or refresh the lab's image and mirrors, booting nothing (lab.up's first, longest step)."""
    from rich.console import Console

    from pdfleet.lab.control import build

    console = Console(stderr=True)
    result = build(this_lab(str(REPO_ROOT / LAB_INVENTORY)), lab_progress(console))
    console.print(f"lab image and mirrors ready in {result.seconds:.0f} s; host wheel {result.host_version}")
    _say_unavailable(console, result.apt_unavailable)


@task(name="down", help={"purge": "also delete the cached image, mirrors and the lab's SSH key"})
@user_errors
def down_task(c: Context, purge: bool = False) -> None:
    """Remove the lab's containers, mounts, mirror servers and bridge (safe to run twice)."""
    from rich.console import Console

    from pdfleet.lab.control import down

    console = Console(stderr=True)
    down(this_lab(), purge=purge, progress=lab_progress(console))
    console.print("lab down")


@task(name="status", help={"inventory": INVENTORY_HELP})
@user_errors
def status_task(c: Context, inventory: str | None = None) -> None:
    """Show each lab host (running, address, SSH) and the mirrors; exits 1 unless all are healthy."""
    from rich.console import Console
    from rich.table import Table

    from pdfleet.lab.control import status

    report = status(this_lab(inventory))
    console = Console()
    table = Table(title=f"pdfleet lab (bridge {'up' if report.bridge else 'absent'})")
    for column in ("host", "address", "groups", "running", "ssh"):
        table.add_column(column)
    for h in report.hosts:
        table.add_row(h.host.name, h.host.address, ",".join(h.host.groups), _yes(h.running), _yes(h.ssh))
    console.print(table)
    mirrors = Table()
    for column in ("mirror", "url", "running", "answering"):
        mirrors.add_column(column)
    for m in report.mirrors:
        mirrors.add_row(m.kind, m.url, _yes(m.running), _yes(m.answering))
    console.print(mirrors)
    if not report.healthy:
        raise Exit(code=1)


def _yes(value: bool) -> str:
    return "[green]yes[/green]" if value else "[red]no[/red]"


@task(
    name="ssh", help={"host": "lab host name, e.g. lab-gw", "command": "run this command instead of a shell"}
)
@user_errors
def ssh_task(c: Context, host: str, command: str = "") -> None:
    """Log in to a lab host as the lab user, with strict host-key checking."""
    from pdfleet.lab.control import find_host
    from pdfleet.lab.paths import LOGIN_USER
    from pdfleet.lab.system import preflight

    lab = this_lab()
    target = find_host(lab, host)
    preflight(("ssh",))
    if not lab.paths.known_hosts.exists():
        raise PdfleetError("the lab is not up (no known_hosts yet); run `invoke lab.up` first.")
    argv = [
        "ssh",
        "-i",
        str(lab.paths.key_file),
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        f"UserKnownHostsFile={lab.paths.known_hosts}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        f"{LOGIN_USER}@{target.address}",
    ]
    if command:
        argv.append(command)
    sys.stdout.flush()
    os.execvp("ssh", argv)


@task(
    name="env",
    help={
        "profile": "The lab profile that was provisioned: its gateway's URL goes into OPENAI_BASE_URL and "
        "ANTHROPIC_BASE_URL, its CA (a TLS profile) into SSL_CERT_FILE (default: lab-cross).",
    },
)
@user_errors
def env_task(c: Context, profile: str = "lab-cross") -> None:
    """Print `export` lines wiring the OpenAI and Anthropic SDKs to the lab gateway (`eval` them)."""
    lab = this_lab()
    topology = open_deployment(c, profile, str(lab.inventory)).topology
    if not topology.gateways:
        why = topology.no_gateway_reason or "it has no host in group gateway"
        raise PdfleetError(f"{lab.inventory} with profile {profile}: no gateway: {why}.")
    key_file: Path = lab.paths.gateway_client_key
    if not key_file.exists():
        raise PdfleetError(
            f"the lab gateway is not provisioned yet ({key_file} is missing); run "
            "`invoke lab.up` and provision a lab profile, e.g. "
            "`invoke provision --profile lab-colocated`."
        )
    try:
        key = key_file.read_text().strip()
    except PermissionError:
        raise PdfleetError(f"{key_file} is readable by root only; run `sudo invoke lab.env`.") from None
    for line in env_lines(topology.gateways[0].url, key, topology.gateways[0].ca_file):
        print(line)


def env_lines(url: str, key: str, ca_file: str | None) -> list[str]:
    """The exports for the OpenAI and Anthropic SDKs: base URLs (the Anthropic SDK appends /v1/messages
    itself), the key, and for a TLS gateway SSL_CERT_FILE, the lab CA: both SDKs' HTTP client (httpx2 via
    httpcore2's default context) reads it and then trusts that file only."""
    lines = [
        f"export OPENAI_BASE_URL={url}/v1",
        f"export OPENAI_API_KEY={key}",
        f"export ANTHROPIC_BASE_URL={url}",
        f"export ANTHROPIC_API_KEY={key}",
    ]
    if ca_file is not None:
        lines.append(f"export SSL_CERT_FILE={ca_file}")
    return lines

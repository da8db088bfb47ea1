"""What a role sees (RoleContext) and how pdfleet finds roles under roles/.

A role is a module `roles/<name>/__init__.py` exporting NAME, APT_PACKAGES, applies(ctx),
operations(ctx, facts) and optionally files(ctx): the fact-independent files it installs, which
`invoke render` writes for review and `operations` installs, so the two never disagree.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from pdfleet.errors import ValidationError
from pdfleet.fleet.pools import ENV_DIR, PoolInstance
from pdfleet.fleet.render import RenderedFile, Renderer
from pdfleet.fleet.secrets import GatewaySecrets
from pdfleet.model.inventory import Host, Inventory
from pdfleet.model.profile import Profile

# Dependency order: drivers and NICs before the KV libraries, the venv before the units using it.
ROLE_ORDER = ("base", "gpu_driver", "rdma", "kv_transfer", "vllm", "services", "gateway", "monitoring")

SERVICE_USER = "pdfleet"
STATE_DIR = "/var/lib/pdfleet"
CONFIG_DIR = ENV_DIR
KV_ENV_FILE = f"{ENV_DIR}/kv-transfer.env"


@dataclass(frozen=True)
class RoleContext:
    """Everything a role may read about the host it plans for; roles read no files themselves."""

    host: Host
    inventory: Inventory
    profile: Profile
    renderer: Renderer
    instances: list[PoolInstance] = field(default_factory=list)
    pdfleet_version: str = ""  # the pdfleet wheel version hosts install (pdfleet.fleet.host_version)
    gateway_secrets: GatewaySecrets | None = None  # hashes of the gateway's client/admin keys
    # that version's wheel on the control machine, uploaded to hosts that install pdfleet (None: the
    # hosts' PyPI index must serve it)
    pdfleet_wheel: Path | None = None

    def render(self, template: str, **variables: Any) -> str:
        return self.renderer.render(template, **variables)


def available_roles() -> list[str]:
    """Role names, in dependency order, for which a roles/<name> package exists."""
    return [name for name in ROLE_ORDER if importlib.util.find_spec(f"roles.{name}") is not None]


def load_roles(selected: str | None = None) -> list[ModuleType]:
    """The role modules to run: all available, or the comma-separated selection (validated)."""
    names = available_roles()
    if selected:
        wanted = [s.strip() for s in selected.split(",") if s.strip()]
        unknown = [w for w in wanted if w not in names]
        if unknown:
            raise ValidationError(
                f"--roles: unknown role(s) {', '.join(unknown)}; available: {', '.join(names)}"
            )
        names = [n for n in names if n in wanted]
    return [importlib.import_module(f"roles.{n}") for n in names]


def _collect(roles: Iterable[ModuleType], ctx: RoleContext, hook: str) -> list[Any]:
    """Concatenate the optional `hook(ctx)` of every role that applies to this host."""
    applicable = [role for role in roles if hasattr(role, hook) and role.applies(ctx)]
    return [item for role in applicable for item in getattr(role, hook)(ctx)]


def role_files(roles: Iterable[ModuleType], ctx: RoleContext) -> list[RenderedFile]:
    """Every fact-independent file the applicable roles install on this host."""
    return _collect(roles, ctx, "files")


@dataclass(frozen=True)
class ManagedUnit:
    """A long-running unit a role keeps active, and the URL that says it is healthy."""

    unit: str
    health_url: str | None


def role_units(roles: Iterable[ModuleType], ctx: RoleContext) -> list[ManagedUnit]:
    """Every unit the applicable roles keep running on this host (roles exporting units(ctx))."""
    return _collect(roles, ctx, "units")

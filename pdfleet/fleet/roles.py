"""The role contract: what a role is (`Role`), what it sees (`RoleContext`), and how a run picks roles.

A role is a plain package under `roles/` (listed, in run order, in `roles.REGISTRY`) whose module
provides NAME, APT_PACKAGES, applies(ctx), facts(ctx), operations(ctx, facts), files(ctx) and units(ctx).
`facts` are those its operations() reads before deciding (the runner gathers the union of a host's roles'
in its first batch: one round trip instead of one per fact);
`files` are the fact-independent files it installs, which `invoke render` writes for review and
`operations` installs, so the two never disagree; `units` are the long-running units it keeps active.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pdfleet.errors import ValidationError
from pdfleet.fleet.host_layout import GATEWAY_CA_FILE, HOST_CODE_DIR, VLLM_START_TIMEOUT_S, WHEEL_DIR
from pdfleet.fleet.render import RenderedFile, Renderer
from pdfleet.fleet.secrets import GatewaySecrets
from pdfleet.fleet.topology import Instance, Topology
from pdfleet.model.inventory import Host
from pdfleet.model.profile import Profile
from pdfleet.model.specs import ModelSpec
from pdfleet.model.weights import WeightsManifest
from pdfleet.ops.base import Fact, FactSource, Handler, Operation, Skip
from pdfleet.ops.files import Directory, File
from pdfleet.ops.pip import PipRequirements
from pdfleet.ops.systemd import restart_handler


def host_kv_profile(profile: Profile, instances: Iterable[Instance]) -> Profile:
    """The profile as a host's P/D model has it (its connector, topology and pools at the top level): the
    model of the host's first prefill or decode instance, else the first model. What host-wide KV
    settings follow on a host serving several models, for the roles and for verify alike."""
    inst = next((i for i in instances if i.kv_role), None)
    spec = profile.served_model(inst.model or None) if inst else profile.served[0]
    return profile.for_model(spec)


@dataclass(frozen=True)
class RoleContext:
    """Everything a role may read about the host it plans for; roles read no files themselves."""

    host: Host
    profile: Profile
    topology: Topology
    renderer: Renderer
    host_version: str = ""  # the host wheel's version (pdfleet.fleet.host_wheel)
    gateway_secrets: GatewaySecrets | None = None  # hashes of the gateway's client/admin keys
    # the host wheel on the control machine, uploaded to the hosts that install it (None: the hosts'
    # PyPI index must serve it)
    host_wheel: Path | None = None
    # `invoke provision --stage S`: the gateways' stage, over the live one (None: keep the live stage)
    stage_override: str | None = None
    # each staged model's manifest by model id, read on the control machine (pdfleet.fleet.weights)
    manifests: Mapping[str, WeightsManifest] = field(default_factory=dict)
    # each staged hub model's token by model id (never rendered: only the weights role's 0600 header file)
    hub_tokens: Mapping[str, str] = field(default_factory=dict, repr=False)
    # the Alertmanager receivers' secrets by name (never rendered: only the monitoring role's 0600 files)
    alert_secrets: Mapping[str, str] = field(default_factory=dict, repr=False)
    # `--model M` beside `--stage S`: the model whose stage stage_override sets (None: the first model's)
    stage_model: str | None = None

    @property
    def instances(self) -> list[Instance]:
        """The vLLM instances this host runs."""
        return self.topology.on_host(self.host.name)

    @property
    def kv_profile(self) -> Profile:
        """The profile as the host's P/D model has it (its KV connector and topology at the top level): the
        model of its first prefill or decode instance, else the first model. What host-wide KV settings
        (the transfer library, kv-transfer.env) follow on a host serving several models."""
        return host_kv_profile(self.profile, self.instances)

    def render(self, template: str, **variables: Any) -> str:
        return self.renderer.render(template, **variables)

    def manifest(self, model: ModelSpec) -> WeightsManifest:
        """A staged model's manifest (the command that built this context must have read it)."""
        found = self.manifests.get(model.id)
        if found is None:
            raise ValidationError(f"{model.id} at {model.revision}: its weights manifest was not read")
        return found


def gateway_ca_files(ctx: RoleContext) -> list[RenderedFile]:
    """The gateway's CA at GATEWAY_CA_FILE (public, 0644) when the gateway speaks TLS, else nothing."""
    tls = ctx.gateway_secrets.tls if ctx.gateway_secrets is not None else None
    return [] if tls is None else [RenderedFile(GATEWAY_CA_FILE, tls.ca, mode="0644")]


def gateway_ca_operations(ctx: RoleContext, notify: tuple[Handler, ...] = ()) -> Iterable[Operation]:
    """Its directory and file (written by every role that calls the gateway: the same content)."""
    for rendered in gateway_ca_files(ctx):
        yield Directory(GATEWAY_CA_FILE.rsplit("/", 1)[0], mode="0755")
        yield File(rendered.path, rendered.content.encode(), mode=rendered.mode, notify=notify)


@dataclass(frozen=True)
class ManagedUnit:
    """A long-running unit a role keeps active, its TCP port and the URL that says it is healthy."""

    unit: str
    port: int | None
    health_url: str | None


class Role(Protocol):
    """One concern of provisioning (a module of `roles/`): which hosts, which operations, which files."""

    NAME: str
    APT_PACKAGES: tuple[str, ...]

    def applies(self, ctx: RoleContext) -> bool: ...

    def facts(self, ctx: RoleContext) -> tuple[Fact[Any], ...]: ...

    def operations(self, ctx: RoleContext, facts: FactSource) -> Iterable[Operation | Skip]: ...

    def files(self, ctx: RoleContext) -> list[RenderedFile]: ...

    def units(self, ctx: RoleContext) -> list[ManagedUnit]: ...


def select_roles(registry: Sequence[Role], selected: str | None = None) -> tuple[Role, ...]:
    """The roles to run, in registry order: all of them, or the comma-separated selection (validated)."""
    if not selected:
        return tuple(registry)
    names = [role.NAME for role in registry]
    wanted = [s.strip() for s in selected.split(",") if s.strip()]
    unknown = [w for w in wanted if w not in names]
    if unknown:
        raise ValidationError(f"--roles: unknown role(s) {', '.join(unknown)}; available: {', '.join(names)}")
    return tuple(role for role in registry if role.NAME in wanted)


def role_files(roles: Iterable[Role], ctx: RoleContext) -> list[RenderedFile]:
    """Every fact-independent file the applicable roles install on this host (a file two roles install
    alike, the gateway's CA, once)."""
    out: dict[str, RenderedFile] = {}
    for f in (f for role in roles if role.applies(ctx) for f in role.files(ctx)):
        assert out.setdefault(f.path, f) == f, f"two roles render {f.path} differently"
    return list(out.values())


def role_units(roles: Iterable[Role], ctx: RoleContext) -> list[ManagedUnit]:
    """Every unit the applicable roles keep running on this host."""
    return [u for role in roles if role.applies(ctx) for u in role.units(ctx)]


def apt_packages(roles: Iterable[Role]) -> tuple[str, ...]:
    """Every apt package the roles may install, sorted (what an apt mirror for the fleet must carry)."""
    return tuple(sorted({package for role in roles for package in role.APT_PACKAGES}))


def instance_restart(instance: Instance) -> Handler:
    """The restart of a vLLM instance's unit, reported done once its /health answers; every role that
    changes what the instance runs notifies this one handler."""
    return restart_handler(instance.unit, health_url=instance.health_url, timeout=VLLM_START_TIMEOUT_S)


def instance_unit(instance: Instance) -> ManagedUnit:
    """The managed unit of a vLLM instance."""
    return ManagedUnit(instance.unit, instance.port, instance.health_url)


def host_wheel_install(
    ctx: RoleContext, venv: str, also: tuple[str, ...] = (), notify: tuple[Handler, ...] = ()
) -> list[Operation]:
    """The one sequence that puts host code on a host: `venv` with this clone's host wheel (uploaded
    first when provision brings it, since a site's index does not carry it) and `also` from the index."""
    mirrors = ctx.profile.mirrors
    ops: list[Operation] = [Directory(HOST_CODE_DIR, mode="0755")]
    find_links: tuple[str, ...] = ()
    if ctx.host_wheel is not None:
        ops.append(Directory(WHEEL_DIR, mode="0755"))
        ops.append(File(f"{WHEEL_DIR}/{ctx.host_wheel.name}", ctx.host_wheel.read_bytes(), mode="0644"))
        find_links = (WHEEL_DIR,)
    ops.append(
        PipRequirements(
            venv,
            (f"pdfleet=={ctx.host_version}", *also),
            index_url=mirrors.pypi,
            trusted_host=mirrors.pypi_trusted_host,
            find_links=find_links,
            notify=notify,
        )
    )
    return ops

"""A deployment: one validated profile and inventory, their topology, the roles to run and what they
install, built once per command by the one door (`load_deployment`) and passed down; `context(host)` is
what the roles see of one host."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pdfleet.errors import ValidationError
from pdfleet.fleet.host_wheel import host_version
from pdfleet.fleet.live_layout import HostPools, apply_layout
from pdfleet.fleet.render import Renderer
from pdfleet.fleet.roles import Role, RoleContext
from pdfleet.fleet.secrets import GatewaySecrets
from pdfleet.fleet.topology import Topology, build_topology
from pdfleet.model.alerting import AlertmanagerSpec
from pdfleet.model.checks import stage_problem
from pdfleet.model.inventory import Host, Inventory, load_inventory
from pdfleet.model.inventory_checks import check_against_inventory
from pdfleet.model.profile import Profile
from pdfleet.model.profile_loader import load_profile
from pdfleet.model.specs import ModelSpec
from pdfleet.model.tls import GatewayTlsSetting
from pdfleet.model.weights import WeightsManifest

GATEWAY_ROLE = "gateway"  # the role that installs the gateway's keys (roles/gateway)
ROLLOUT_ROLE = "rollout"  # installs the stage-only key for the rollout controller (roles/rollout)
MONITORING_ROLE = "monitoring"  # Alertmanager receivers' secrets; the gateway's CA beside Prometheus (TLS)

# (client key file, admin key file, outside alias -> key file, TLS, controller key file, named keys' dir)
# -> the gateway's keys
Secrets = Callable[[str, str, Mapping[str, str], GatewayTlsSetting, str, str], GatewaySecrets]
# the staged models (one per id) -> their manifests by model id (pdfleet.fleet.weights.load_manifests)
Manifests = Callable[[Sequence[ModelSpec]], Mapping[str, WeightsManifest]]
Tokens = Callable[[Sequence[ModelSpec]], Mapping[str, str]]  # the same models -> hub tokens by model id
# roles whose plans read the manifests: the weights role stages by them (verify and doctor read them too)
MANIFEST_ROLES = ("weights", "gateway")  # the gateway copies a model's tokenizer files (tokenizer: staged)
AlertSecrets = Callable[[AlertmanagerSpec], Mapping[str, str]]  # fleet.alert_secrets.read_alert_secrets
HostWheel = Callable[[], Path]  # this clone's host wheel on the control machine (built, or from the cache)


@dataclass(frozen=True)
class Deployment:
    """Profile, inventory, topology, roles and selected hosts of one command (see the module docstring)."""

    profile: Profile
    inventory: Inventory
    topology: Topology
    roles: tuple[Role, ...]
    renderer: Renderer
    host_version: str
    hosts: tuple[Host, ...]  # the hosts the command acts on (`--limit`), in inventory order
    gateway_secrets: GatewaySecrets | None = None
    host_wheel: Path | None = None  # uploaded by the roles of hosts that run pdfleet code
    stage_override: str | None = None  # `invoke provision --stage S`
    manifests: Mapping[str, WeightsManifest] = field(default_factory=dict)  # staged models' by model id
    hub_tokens: Mapping[str, str] = field(default_factory=dict, repr=False)  # staged hub models' by model id
    alert_secrets: Mapping[str, str] = field(default_factory=dict, repr=False)  # the receivers', by name
    stage_model: str | None = None  # the model whose stage stage_override sets (--model; None: the first)

    def context(self, host: Host) -> RoleContext:
        """What the roles see for one host."""
        return RoleContext(
            host,
            self.profile,
            self.topology,
            self.renderer,
            self.host_version,
            self.gateway_secrets,
            self.host_wheel,
            self.stage_override,
            self.manifests,
            self.hub_tokens,
            self.alert_secrets,
            self.stage_model,
        )


@dataclass(frozen=True)
class DeploymentRequest:
    """What a command asks of the one door: which profile on which inventory, and what else it needs built
    in. The defaults build the plainest deployment: every host, no roles, no keys, no wheel."""

    profile: str  # a name in profiles_dir, or a path to a profile file
    inventory: Path
    profiles_dir: Path
    templates_dir: Path
    roles: tuple[Role, ...] = ()
    lab_network: ipaddress.IPv4Network | None = None  # addresses in it are lab hosts
    limit: str | None = None  # `--limit`: hosts and groups, comma-separated
    stage: str | None = None  # `invoke provision --stage S`: over the gateways' live stage
    stage_model: str | None = None  # `--model M`: whose stage (needed when the profile serves several)
    secrets: Secrets | None = None  # asked only when a selected role installs keys on a selected host
    host_wheel: HostWheel | None = None  # asked only when a selected host gets the wheel uploaded
    manifests: Manifests | None = None  # asked only when a selected role reads staged models' manifests
    hub_tokens: Tokens | None = None  # asked with the manifests: the hub tokens hosts download with
    # the live layout (fleet.live_layout) and its state file: the inventory's pool groups rewritten to it
    layout: tuple[str, HostPools] | None = None  # (where it was read, the layout)
    # asked only when the monitoring role runs on a monitoring host: the receivers' secrets by name
    alert_secrets: AlertSecrets | None = None


def load_deployment(request: DeploymentRequest) -> Deployment:
    """The one door: load and cross-check profile and inventory (its pool groups rewritten to the live
    layout, when there is one; ValidationError before anything is touched or created), then the topology,
    the selected hosts, and only what they need: the gateway's keys, the host wheel, the stage override."""
    profile = load_profile(request.profile, request.profiles_dir)
    inventory = load_inventory(request.inventory)
    if request.layout is not None:
        source, live = request.layout
        inventory = apply_layout(inventory, profile.served[0], live, source)
    check_against_inventory(profile, inventory)
    stage_model = staged_model(profile, request.stage, request.stage_model)
    hosts = tuple(inventory.limit(request.limit).hosts.values())
    topology = build_topology(profile, inventory, request.lab_network)
    roles = tuple(request.roles)
    keys, wheel = None, None
    if installs_gateway_side(roles, topology, hosts):
        gw = profile.gateway
        outside = {alias: o.key_file for alias, o in gw.outside.items()}
        keys = (
            None
            if request.secrets is None
            else request.secrets(
                gw.client_key_file, gw.admin_key_file, outside, gw.tls, gw.controller_key_file, gw.keys_dir
            )
        )
        wheel = None if request.host_wheel is None else request.host_wheel()
    renderer = Renderer(request.templates_dir)
    manifests: Mapping[str, WeightsManifest] = {}
    tokens: Mapping[str, str] = {}
    if request.manifests is not None and any(role.NAME in MANIFEST_ROLES for role in roles):
        staged = [spec.model for spec in profile.served if spec.model.staged]
        on_selected = {name for host in hosts for name in (i.model for i in topology.on_host(host.name))}
        names = {r.NAME for r in roles}
        on_gateway = "gateway" in names and any(topology.gateway_on(h.name) for h in hosts)
        tokenizing = {
            spec.model.id
            for spec in profile.served
            if on_gateway and spec.gateway.decider.tokenizer == "staged"
        }
        wanted = [
            model
            for model in staged
            if ("weights" in names and any(profile.served_model(n).model.id == model.id for n in on_selected))
            or model.id in tokenizing
        ]
        manifests = request.manifests(wanted) if wanted else {}
        if request.hub_tokens is not None and wanted:
            tokens = request.hub_tokens(wanted)
    alerting: Mapping[str, str] = {}
    monitoring_selected = any(topology.prometheus_on(h.name) for h in hosts)
    if (
        request.alert_secrets is not None
        and MONITORING_ROLE in {r.NAME for r in roles}
        and monitoring_selected
    ):
        alerting = request.alert_secrets(profile.monitoring.alertmanager)
    return Deployment(
        profile,
        inventory,
        topology,
        roles,
        renderer,
        host_version(),
        hosts,
        keys,
        wheel,
        request.stage,
        manifests,
        tokens,
        alerting,
        stage_model,
    )


def staged_model(profile: Profile, stage: str | None, model: str | None) -> str | None:
    """The name of the model `--stage` sets (`--model`, or the only one), checked: a stage of that model,
    a model of the profile (a profile serving several needs --model; ValidationError naming them), and
    --model only with --stage. None without --stage."""
    if stage is None:
        if model is not None:
            raise ValidationError("--model: it names the model whose stage --stage sets; give --stage too")
        return None
    try:
        spec = profile.served_model(model)
    except ValidationError as exc:
        raise ValidationError(f"--stage: {exc}") from None
    problem = stage_problem(spec, stage)
    if problem:
        raise ValidationError(f"--stage: {problem}")
    return spec.name


def installs_gateway_side(roles: Iterable[Role], topology: Topology, hosts: Iterable[Host]) -> bool:
    """Whether a selected role installs the gateway's keys and the host wheel on a selected host: the
    gateway role on a gateway host, the rollout role on the controller's (a site's own index lacks the
    wheel, so it is uploaded; pool hosts of an `engine: sim` profile install it from the index). Only then
    are the keys read or generated and the wheel built."""
    names = {role.NAME for role in roles}
    installing = {g.host for g in topology.gateways} if GATEWAY_ROLE in names else set()
    if ROLLOUT_ROLE in names and topology.controller is not None:
        installing.add(topology.controller.host.name)
    if MONITORING_ROLE in names and any(g.ca_file for g in topology.gateways):
        installing |= {p.host for p in topology.monitoring}  # Prometheus verifies the gateway with its CA
    return any(host.name in installing for host in hosts)

"""gateway: pdfleet-gateway (one key, one base URL) and a vllm-router in P/D mode per disaggregated model
on the gateway group.

The gateway maps each request's `model` alias to its model's pools, and routes it to the colocated pool
or, through that model's router, to its P/D pool, by the live stage; the router runs the prefill→decode
protocol. Every model's aliases are in the one policy; in a `models:` profile each model is a policy group
with its own stage, stages and long-prompt threshold (the top level's are the first model's). Policy and
key hashes live under /etc/pdfleet/gateway (0600), the policy written by the gateway's own policy module;
a policy change reloads the gateway (SIGHUP), never restarts it. The profile's `gateway.stage` is only the
initial stage: provision keeps the stage the host runs (set by the rollout controller through
/admin/stage, per model group too) unless `invoke provision --stage S` overrides it.

A model whose gateway runs its own tokenizer (`gateway.decider.tokenizer: staged`) has its staged revision's
tokenizer files (TOKENIZER_FILES in its manifest: the bytes its engines load, checked by SHA-256) copied to
the gateway host's staged directory of that revision, as roles/weights copies them to its pool hosts, and the
route names that directory (`tokenizer:`); the gateway's venv gets the tokenizer extra (tokenizers, jinja2).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pdfleet.fleet.gateway_tls import TlsMaterial
from pdfleet.fleet.host_layout import (
    GATEWAY_CA_FILE,
    GATEWAY_TLS_CERT_FILE,
    GATEWAY_TLS_KEY_FILE,
    SERVICE_USER,
    UNIT_DIR,
)
from pdfleet.fleet.host_wheel import TOKENIZER_EXTRA, extra_requirements
from pdfleet.fleet.live_stage import Staging, live_policy, model_stages, policy_stage, policy_version
from pdfleet.fleet.render import RenderedFile
from pdfleet.fleet.roles import (
    ManagedUnit,
    RoleContext,
    gateway_ca_files,
    gateway_ca_operations,
    host_wheel_install,
)
from pdfleet.fleet.secrets import GatewaySecrets
from pdfleet.fleet.topology import ROUTER_ADDRESS, Gateway, ModelTopology, Router
from pdfleet.fleet.weights import staged_dir
from pdfleet.gateway import policy as gateway_policy
from pdfleet.model.connectors import MOONCAKE, NIXL
from pdfleet.model.profile import GatewayLimits, RouterPolicy
from pdfleet.model.routing import MODEL_DECIDER_KEYS
from pdfleet.model.served import ServedModel
from pdfleet.model.stages import StageSpec
from pdfleet.ops.base import Fact, FactSource, Handler, Operation, Run, Skip
from pdfleet.ops.files import Directory, File, FileContent
from pdfleet.ops.systemd import Service, SystemdUnit, restart_handler
from roles.gateway.outside import outside_files, outside_routes
from roles.gateway.tokenizer import tokenizer_models, tokenizer_operations

# a profile whose slo.stall_ms is the gateway's default renders the policy it rendered before
STALL_DEFAULT_MS = gateway_policy.PolicySpec.model_fields["stall_threshold_ms"].default

NAME = "gateway"
APT_PACKAGES: tuple[str, ...] = ()

CONFIG_DIR = "/etc/pdfleet/gateway"
POLICY_FILE = f"{CONFIG_DIR}/policy.yaml"
# the site's certificate and key (gateway.tls), pushed from the control machine; a change reloads
TLS_CERT_FILE = GATEWAY_TLS_CERT_FILE  # `invoke verify` reads its expiry there
TLS_KEY_FILE = GATEWAY_TLS_KEY_FILE
VENV = "/opt/pdfleet/gateway"
GATEWAY_UNIT = "pdfleet-gateway.service"
ROUTER_CONNECTORS = {NIXL: "nixl", MOONCAKE: "mooncake"}  # vllm-router --kv-connector
START_TIMEOUT_S = 300
SHUTDOWN_TIMEOUT_S = 50  # streams in flight get this long to finish; systemd waits 10 s more


def applies(ctx: RoleContext) -> bool:
    return ctx.host.in_group("gateway")


def facts(ctx: RoleContext) -> tuple[Fact[Any], ...]:
    """The policy file the host runs (its live stage), where the gateway is installed."""
    return () if _why_not(ctx) else (FileContent(POLICY_FILE),)


def _why_not(ctx: RoleContext) -> str | None:
    """Why this host gets no gateway, or None."""
    if ctx.topology.no_gateway_reason:
        return ctx.topology.no_gateway_reason
    if ctx.gateway_secrets is None:
        return "no gateway keys were provided (provision generates them on the control machine)"
    return None


def _gateway(ctx: RoleContext) -> Gateway:
    gateway = ctx.topology.gateway_on(ctx.host.name)
    assert gateway is not None, "applies() and _why_not() admit only the topology's gateway hosts"
    return gateway


def policy_args(policy: RouterPolicy) -> list[str]:
    """The router's selection flags: one --policy when both pools share it, else one per pool."""
    return policy.argv()


def router_argv(ctx: RoleContext, router: Router) -> list[str]:
    """A model's vllm-router in P/D mode over its prefill and decode instances, selecting by its policy."""
    spec = ctx.profile.served_model(router.model)
    model = ctx.topology.model(router.model)
    argv = [f"{VENV}/bin/vllm-router", "--vllm-pd-disaggregation"]
    for inst in model.pool("prefill"):
        argv += ["--prefill", inst.url] + ([str(inst.bootstrap_port)] if inst.bootstrap_port else [])
    for url in model.pool_urls("decode"):
        argv += ["--decode", url]
    argv += [
        *policy_args(spec.gateway.router_policy),
        "--kv-connector",
        ROUTER_CONNECTORS.get(spec.kv_transfer.connector, "nixl"),
        "--host",
        ROUTER_ADDRESS,
        "--port",
        str(router.port),
        "--prometheus-host",
        router.address,  # scraped by Prometheus on the monitoring host
        "--prometheus-port",
        str(router.metrics_port),
    ]
    return argv


def policy_limits(limits: GatewayLimits, models: dict[str, int | None]) -> dict[str, Any]:
    """The policy's `limits:` section from the profile's (empty when none is set: limits default to off);
    `models`: each alias and its model's prompt-token cap."""
    out: dict[str, Any] = {}
    default = limits.default.model_dump(exclude_none=True)
    if default:
        out["default"] = default
    keys = {name: lim.model_dump(exclude_none=True) for name, lim in limits.keys.items()}
    if any(keys.values()):
        out["keys"] = {name: lim for name, lim in keys.items() if lim}
    capped = {alias: {"max_prompt_tokens": cap} for alias, cap in models.items() if cap is not None}
    if capped:
        out["models"] = capped
    return out


def _route(ctx: RoleContext, model: ModelTopology) -> dict[str, Any]:
    """One model's route on this gateway: its colocated URLs, and its router when it disaggregates."""
    route: dict[str, Any] = {"colocated": model.pool_urls("colocated")}
    spec = ctx.profile.served_model(model.name)
    if spec.gateway.decider.tokenizer == "staged":  # chat prompts counted and cut as the engines' ids
        route["tokenizer"] = staged_dir(spec.model)
    events = [i.kv_events_endpoint for i in model.pool("colocated")]
    if events and all(events):  # the model's cache facts from its instances' KV events
        route["kv_events"] = events
        route["kv_events_release"] = ctx.profile.vllm.version
        replays = [i.kv_events_replay_endpoint for i in model.pool("colocated")]
        if all(replays):  # a sequence gap is first asked of the publisher's replay socket
            route["kv_events_replay"] = replays
    router = model.router_on(ctx.host.name)
    if router is not None:
        route["disagg"] = router.url
        decider = ctx.profile.gateway.decider
        prefill_events = [i.kv_events_endpoint for i in model.pool("prefill")]
        if events and prefill_events and all(prefill_events):  # the P/D candidate's cache facts
            route["prefill_kv_events"] = prefill_events
            prefill_replays = [i.kv_events_replay_endpoint for i in model.pool("prefill")]
            if all(prefill_replays):
                route["prefill_kv_events_replay"] = prefill_replays
            spec = ctx.profile.served_model(model.name)
            route["prefill_cache_aware"] = spec.gateway.router_policy.prefill == "cache_aware"
        # the P/D instances the decider scrapes where a bypass bound reads them (or their events are read)
        if decider.prefill_busy_waiting is not None or "prefill_kv_events" in route:
            route["prefill"] = model.pool_urls("prefill")
        if decider.decode_busy_waiting is not None:
            route["decode"] = model.pool_urls("decode")
    return route


def _group_doc(spec: ServedModel, staging: Staging | None) -> dict[str, Any]:
    """A model's policy group: its threshold, and its stage and stages unless it follows the top level's."""
    doc: dict[str, Any] = {"long_prompt_tokens": spec.gateway.long_prompt_tokens}
    if staging is not None:
        doc["stage"] = staging[0]
        doc["stages"] = {name: weights.model_dump() for name, weights in staging[1].items()}
    return doc


def policy_text(
    ctx: RoleContext,
    version: int,
    stage: str,
    stages: dict[str, StageSpec],
    groups: Mapping[str, Staging | None] | None = None,
) -> str:
    """The gateway's policy file for this host at a version and stage, written (and checked) by the
    gateway's own policy module: every model's aliases, each to its model's pools; a `models:` profile's
    models are the policy's groups, each with its own stage (`groups`), stages and long-prompt threshold."""
    gw = ctx.profile.gateway
    first: ServedModel = ctx.profile.served[0]
    gateway = _gateway(ctx)
    listen: dict[str, Any] = {"host": gateway.address, "port": gw.port}
    if gw.admin_port:
        listen["admin_port"] = gw.admin_port
    if gateway.scheme == "https":
        listen["tls"] = {"cert_file": TLS_CERT_FILE, "key_file": TLS_KEY_FILE}
    # the pools serve the aliases too (ServedModel.served_model_names): bodies pass through unchanged
    routes: dict[str, Any] = {}
    caps: dict[str, int | None] = {}
    group_docs: dict[str, Any] = {}
    for spec, model in zip(ctx.profile.served, ctx.topology.models, strict=True):
        listed = groups is not None and spec.name in groups
        for alias in spec.aliases:
            routes[alias] = _route(ctx, model) | ({"group": spec.name} if listed else {})
            caps[alias] = spec.gateway.limits.model_max_prompt_tokens
        if listed:
            group_docs[spec.name] = _group_doc(spec, (groups or {})[spec.name])
    doc: dict[str, Any] = {
        "version": version,
        "listen": listen,
        "keys_file": gw.keys_file,
        "models": {**routes, **outside_routes(gw.outside, list(routes), CONFIG_DIR)},
        "estimator": {"chars_per_token": gw.chars_per_token},
        "long_prompt_tokens": first.gateway.long_prompt_tokens,
        "stage": stage,
        "stages": {name: spec.model_dump() for name, spec in stages.items()},
    }
    if first.slo.stall_ms != STALL_DEFAULT_MS:  # the profile's stall is the gateway's (bench, gates, alerts)
        doc["stall_threshold_ms"] = first.slo.stall_ms
    # the cache source and the tokenizer are each model's: its routes list the events endpoints and the
    # tokenizer's directory
    decider = gw.decider.model_dump(exclude_defaults=True, exclude=set(MODEL_DECIDER_KEYS))
    if decider:  # a profile without one renders the policy it rendered before the decider
        doc["decider"] = decider
    for key in ("shadow", "capture"):  # off and default unless the profile sets them: rendered as before
        section = getattr(gw, key).model_dump(exclude_defaults=True)
        if section:
            doc[key] = section
    if group_docs:
        doc["groups"] = group_docs
    limits = policy_limits(gw.limits, caps)
    if limits:
        doc["limits"] = limits
    header = (
        f"Managed by pdfleet (profile {ctx.profile.name}): the gateway's routing policy.\n"
        "Reloaded without dropping streams on change (systemctl reload pdfleet-gateway = SIGHUP)."
    )
    return gateway_policy.policy_text(doc, Path(POLICY_FILE), header)


def live_policy_text(ctx: RoleContext, facts: FactSource) -> str:
    """The policy file provision installs: the live stage kept (or `--stage`), the version bumped only
    when the policy's meaning changes (pdfleet.fleet.live_stage's rule)."""
    source = Path(POLICY_FILE)
    live = live_policy(facts.get(FileContent(POLICY_FILE)), source)
    stage, stages = policy_stage(ctx.profile, live, ctx.stage_override, ctx.stage_model)
    groups = model_stages(ctx.profile, live, ctx.stage_override, ctx.stage_model)

    def rendered(version: int) -> gateway_policy.PolicySpec:
        return gateway_policy.parse_policy(source, policy_text(ctx, version, stage, stages, groups))

    return policy_text(ctx, policy_version(ctx.profile, live, rendered), stage, stages, groups)


def files(ctx: RoleContext) -> list[RenderedFile]:
    """The files at the profile's initial stage and version (`invoke render` has no live policy)."""
    if _why_not(ctx):
        return []
    gw = ctx.profile.gateway
    routers = ctx.topology.routers_on(ctx.host.name)
    secrets = ctx.gateway_secrets
    assert secrets is not None
    stage, stages = policy_stage(ctx.profile, None, ctx.stage_override, ctx.stage_model)
    groups = model_stages(ctx.profile, None, ctx.stage_override, ctx.stage_model)
    policy = policy_text(ctx, gw.policy_version, stage, stages, groups)
    keys = ctx.render(
        "gateway-keys.yaml.j2",
        client_sha256=secrets.client_sha256,
        admin_sha256=secrets.admin_sha256,
        more=keys_lines(secrets),
    )
    owner = SERVICE_USER
    out = [
        RenderedFile(POLICY_FILE, policy, mode="0600", owner=owner, group=owner),
        RenderedFile(gw.keys_file, keys, mode="0600", secret=True, owner=owner, group=owner),
        RenderedFile(
            f"{UNIT_DIR}/{GATEWAY_UNIT}",
            ctx.render(
                "pdfleet-gateway.service.j2",
                service_user=SERVICE_USER,
                router_unit=" ".join(r.unit for r in routers) or None,
                config_dir=CONFIG_DIR,
                argv=[
                    f"{VENV}/bin/pdfleet-gateway",
                    "--config",
                    POLICY_FILE,
                    "--shutdown-timeout",
                    str(SHUTDOWN_TIMEOUT_S),
                ],
                check_argv=[f"{VENV}/bin/pdfleet-gateway", "--config", POLICY_FILE, "--check"],
                stop_timeout=SHUTDOWN_TIMEOUT_S + 10,
            ),
        ),
    ]
    out += outside_files(secrets.outside_keys, CONFIG_DIR, owner)
    out += tls_files(secrets.tls, owner) + gateway_ca_files(ctx)
    for router in routers:
        connector = ctx.profile.served_model(router.model).kv_transfer.connector
        unit = ctx.render(
            "vllm-router-pd.service.j2",
            service_user=SERVICE_USER,
            kv_connector=connector,
            argv=router_argv(ctx, router),
        )
        out.append(RenderedFile(f"{UNIT_DIR}/{router.unit}", unit))
    return out


def keys_lines(secrets: GatewaySecrets) -> list[str]:
    """The keys file's entries after the client and admin keys: the controller's stage-only key, then the
    named client keys (`invoke keys.*`), one YAML flow line each (hashes only)."""
    lines = []
    if secrets.controller_sha256 is not None:
        lines.append(f'{{name: controller, sha256: "{secrets.controller_sha256}", scope: stage}}')
    return lines + [entry.model_dump_json(exclude_defaults=True) for entry in secrets.named]


def tls_toggles(ctx: RoleContext, facts: FactSource) -> bool:
    """Whether the host's gateway turns TLS on or off (the policy it runs has listen.tls and this one not,
    or the other way): a reload refuses that (the sockets are bound), so the gateway restarts instead."""
    live = live_policy(facts.get(FileContent(POLICY_FILE)), Path(POLICY_FILE))
    return live is not None and (live.listen.tls is None) != (_gateway(ctx).scheme == "http")


def tls_files(material: TlsMaterial | None, owner: str) -> list[RenderedFile]:
    """The certificate (0644) and its key (0600, a secret: never shown in a diff) the gateway reads
    (nothing for plain HTTP)."""
    if material is None:
        return []
    return [
        RenderedFile(TLS_CERT_FILE, material.cert, mode="0644", owner=owner, group=owner),
        RenderedFile(TLS_KEY_FILE, material.key, mode="0600", secret=True, owner=owner, group=owner),
    ]


def units(ctx: RoleContext) -> list[ManagedUnit]:
    if _why_not(ctx):
        return []
    gateway = _gateway(ctx)
    routers = [ManagedUnit(r.unit, r.port, r.health_url) for r in ctx.topology.routers_on(ctx.host.name)]
    return [*routers, ManagedUnit(GATEWAY_UNIT, gateway.port, f"{gateway.url}/health")]


def operations(ctx: RoleContext, facts: FactSource) -> Iterable[Operation | Skip]:
    reason = _why_not(ctx)
    if reason:
        yield Skip("gateway", reason)
        return
    gw = ctx.profile.gateway
    restarts = {u.unit: restart_handler(u.unit, u.health_url, START_TIMEOUT_S) for u in units(ctx)}
    # The gateway keeps its old policy when a new one is bad; checking first makes provision say so.
    check = Run(f"sudo -u {SERVICE_USER} {VENV}/bin/pdfleet-gateway --config {POLICY_FILE} --check")
    reload = Handler(
        f"reload {GATEWAY_UNIT}", (check, Run(f"systemctl reload {GATEWAY_UNIT}")), unit=GATEWAY_UNIT
    )
    also = extra_requirements(TOKENIZER_EXTRA) if tokenizer_models(ctx) else ()
    yield from host_wheel_install(
        ctx, VENV, (f"vllm-router=={gw.router_version}", *also), notify=tuple(restarts.values())
    )
    # before the policy that names them (its check loads them)
    yield from tokenizer_operations(ctx, (reload,))
    yield from gateway_ca_operations(ctx)  # before the unit starts: its health probe verifies with it
    yield Directory(CONFIG_DIR, mode="0700", owner=SERVICE_USER, group=SERVICE_USER)
    for rendered in files(ctx):
        name = rendered.path.rsplit("/", 1)[1]
        if rendered.path.startswith(UNIT_DIR):
            yield SystemdUnit(name, rendered.content.encode(), restart=restarts[name])
            continue
        if rendered.path == GATEWAY_CA_FILE:
            continue  # written above
        content = live_policy_text(ctx, facts) if rendered.path == POLICY_FILE else rendered.content
        yield File(
            rendered.path,
            content.encode(),
            mode=rendered.mode,
            owner=rendered.owner,
            group=rendered.group,
            secret=rendered.secret,
            notify=(restarts[GATEWAY_UNIT] if tls_toggles(ctx, facts) else reload,),
        )
    for unit in units(ctx):
        yield Service(
            unit.unit, enabled=True, running=True, health_url=unit.health_url, health_timeout=START_TIMEOUT_S
        )

"""gateway: pdfleet-gateway (one key, one base URL) and vllm-router in P/D mode on the gateway group.

The gateway routes each request to the colocated pool or, through the router, to the P/D pool, by
the live stage; the router runs the prefill→decode protocol. Policy and key hashes live under
/etc/pdfleet/gateway (0600), the policy written by the gateway's own policy module; a policy change
reloads the gateway (SIGHUP), never restarts it. The
profile's `gateway.stage` is only the initial stage: provision keeps the stage the host runs (set by the
rollout controller through /admin/stage) unless `invoke provision --stage S` overrides it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pdfleet.fleet.host_layout import SERVICE_USER, UNIT_DIR
from pdfleet.fleet.live_stage import live_policy, policy_stage, policy_version
from pdfleet.fleet.render import RenderedFile
from pdfleet.fleet.roles import ManagedUnit, RoleContext, host_wheel_install
from pdfleet.fleet.topology import ROUTER_ADDRESS, Gateway
from pdfleet.gateway import policy as gateway_policy
from pdfleet.model.connectors import MOONCAKE, NIXL
from pdfleet.model.profile import GatewayLimits, RouterPolicy
from pdfleet.model.stages import StageSpec
from pdfleet.ops.base import Fact, FactSource, Handler, Operation, Run, Skip
from pdfleet.ops.files import Directory, File, FileContent
from pdfleet.ops.systemd import Service, SystemdUnit, restart_handler
from roles.gateway.outside import outside_files, outside_routes

NAME = "gateway"
APT_PACKAGES: tuple[str, ...] = ()

CONFIG_DIR = "/etc/pdfleet/gateway"
POLICY_FILE = f"{CONFIG_DIR}/policy.yaml"
VENV = "/opt/pdfleet/gateway"
GATEWAY_UNIT = "pdfleet-gateway.service"
ROUTER_UNIT = "vllm-router-pd.service"
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
    if policy.prefill == policy.decode:
        return ["--policy", policy.prefill]
    return ["--prefill-policy", policy.prefill, "--decode-policy", policy.decode]


def router_argv(ctx: RoleContext, gateway: Gateway) -> list[str]:
    """vllm-router in P/D mode over every prefill and decode instance, selecting by the profile's policy."""
    kv = ctx.profile.kv_transfer
    argv = [f"{VENV}/bin/vllm-router", "--vllm-pd-disaggregation"]
    for inst in ctx.topology.pool("prefill"):
        argv += ["--prefill", inst.url] + ([str(inst.bootstrap_port)] if inst.bootstrap_port else [])
    for url in ctx.topology.pool_urls("decode"):
        argv += ["--decode", url]
    argv += [
        *policy_args(ctx.profile.gateway.router_policy),
        "--kv-connector",
        ROUTER_CONNECTORS.get(kv.connector, "nixl"),
        "--host",
        ROUTER_ADDRESS,
        "--port",
        str(gateway.router_port),
        "--prometheus-host",
        gateway.address,  # scraped by Prometheus on the monitoring host
        "--prometheus-port",
        str(gateway.router_metrics_port),
    ]
    return argv


def policy_limits(limits: GatewayLimits, alias: str) -> dict[str, Any]:
    """The policy's `limits:` section from the profile's (empty when none is set: limits default to off)."""
    out: dict[str, Any] = {}
    default = limits.default.model_dump(exclude_none=True)
    if default:
        out["default"] = default
    keys = {name: lim.model_dump(exclude_none=True) for name, lim in limits.keys.items()}
    if any(keys.values()):
        out["keys"] = {name: lim for name, lim in keys.items() if lim}
    if limits.model_max_prompt_tokens is not None:
        out["models"] = {alias: {"max_prompt_tokens": limits.model_max_prompt_tokens}}
    return out


def policy_text(ctx: RoleContext, version: int, stage: str, stages: dict[str, StageSpec]) -> str:
    """The gateway's policy file for this host at a version and stage, written (and checked) by the
    gateway's own policy module."""
    gw = ctx.profile.gateway
    gateway = _gateway(ctx)
    alias = gw.model_alias or ctx.profile.model.id
    listen: dict[str, Any] = {"host": gateway.address, "port": gw.port}
    if gw.admin_port:
        listen["admin_port"] = gw.admin_port
    # the pools serve the alias too (vllm_args.served_model_names): bodies pass through unchanged
    route: dict[str, Any] = {"colocated": list(ctx.topology.pool_urls("colocated"))}
    if gateway.router_url:
        route["disagg"] = gateway.router_url
    doc: dict[str, Any] = {
        "version": version,
        "listen": listen,
        "keys_file": gw.keys_file,
        "models": {alias: route, **outside_routes(gw.outside, [alias], CONFIG_DIR)},
        "estimator": {"chars_per_token": gw.chars_per_token},
        "long_prompt_tokens": gw.long_prompt_tokens,
        "stage": stage,
        "stages": {name: spec.model_dump() for name, spec in stages.items()},
    }
    limits = policy_limits(gw.limits, alias)
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
    stage, stages = policy_stage(ctx.profile, live, ctx.stage_override)

    def rendered(version: int) -> gateway_policy.PolicySpec:
        return gateway_policy.parse_policy(source, policy_text(ctx, version, stage, stages))

    return policy_text(ctx, policy_version(ctx.profile, live, rendered), stage, stages)


def files(ctx: RoleContext) -> list[RenderedFile]:
    """The files at the profile's initial stage and version (`invoke render` has no live policy)."""
    if _why_not(ctx):
        return []
    gw = ctx.profile.gateway
    gateway = _gateway(ctx)
    secrets = ctx.gateway_secrets
    assert secrets is not None
    stage = ctx.stage_override or gw.stage
    policy = policy_text(ctx, gw.policy_version, stage, dict(gw.stages))
    keys = ctx.render(
        "gateway-keys.yaml.j2", client_sha256=secrets.client_sha256, admin_sha256=secrets.admin_sha256
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
                router_unit=ROUTER_UNIT if gateway.router_url else None,
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
    if gateway.router_url:
        out.append(
            RenderedFile(
                f"{UNIT_DIR}/{ROUTER_UNIT}",
                ctx.render(
                    "vllm-router-pd.service.j2",
                    service_user=SERVICE_USER,
                    kv_connector=ctx.profile.kv_transfer.connector,
                    argv=router_argv(ctx, gateway),
                ),
            )
        )
    return out


def units(ctx: RoleContext) -> list[ManagedUnit]:
    if _why_not(ctx):
        return []
    gateway = _gateway(ctx)
    found = [ManagedUnit(GATEWAY_UNIT, gateway.port, f"{gateway.url}/health")]
    if gateway.router_url:
        found.insert(0, ManagedUnit(ROUTER_UNIT, gateway.router_port, f"{gateway.router_url}/health"))
    return found


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
    yield from host_wheel_install(
        ctx, VENV, (f"vllm-router=={gw.router_version}",), notify=tuple(restarts.values())
    )
    yield Directory(CONFIG_DIR, mode="0700", owner=SERVICE_USER, group=SERVICE_USER)
    for rendered in files(ctx):
        name = rendered.path.rsplit("/", 1)[1]
        if rendered.path.startswith(UNIT_DIR):
            yield SystemdUnit(name, rendered.content.encode(), restart=restarts[name])
            continue
        content = live_policy_text(ctx, facts) if rendered.path == POLICY_FILE else rendered.content
        yield File(
            rendered.path,
            content.encode(),
            mode=rendered.mode,
            owner=rendered.owner,
            group=rendered.group,
            secret=rendered.secret,
            notify=(reload,),
        )
    for unit in units(ctx):
        yield Service(
            unit.unit, enabled=True, running=True, health_url=unit.health_url, health_timeout=START_TIMEOUT_S
        )

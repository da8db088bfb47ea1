"""gateway: pdfleet-gateway (one key, one base URL) and vllm-router in P/D mode on the gateway group.

The gateway routes each request to the colocated pool or, through the router, to the P/D pool, by
the profile's active stage; the router runs the prefill→decode protocol. Policy and key hashes live
under /etc/pdfleet/gateway (0600); a policy change reloads the gateway (SIGHUP), never restarts it.
"""

from __future__ import annotations

from collections.abc import Iterable

from pdfleet.fleet.pools import UNIT_DIR, pool_urls, serve_address
from pdfleet.fleet.render import RenderedFile
from pdfleet.fleet.roles import SERVICE_USER, ManagedUnit, RoleContext
from pdfleet.model.connectors import MOONCAKE, NIXL
from pdfleet.ops.base import FactSource, Handler, Operation, Run, Skip
from pdfleet.ops.files import Directory, File
from pdfleet.ops.pip import PipRequirements
from pdfleet.ops.systemd import Service, SystemdUnit, restart_handler

NAME = "gateway"
APT_PACKAGES: tuple[str, ...] = ()

CONFIG_DIR = "/etc/pdfleet/gateway"
WHEEL_DIR = "/opt/pdfleet/wheels"  # this clone's pdfleet wheel, uploaded by provision
POLICY_FILE = f"{CONFIG_DIR}/policy.yaml"
VENV = "/opt/pdfleet/gateway"
GATEWAY_UNIT = "pdfleet-gateway.service"
ROUTER_UNIT = "vllm-router-pd.service"
ROUTER_CONNECTORS = {NIXL: "nixl", MOONCAKE: "mooncake"}  # vllm-router --kv-connector
START_TIMEOUT_S = 300
SHUTDOWN_TIMEOUT_S = 50  # streams in flight get this long to finish; systemd waits 10 s more


def applies(ctx: RoleContext) -> bool:
    return ctx.host.in_group("gateway")


def _why_not(ctx: RoleContext) -> str | None:
    """Why this profile has no gateway to install, or None."""
    if ctx.profile.pools.colocated is None:
        return "the profile has no colocated pool; the gateway routes between colocated and P/D pools"
    if ctx.gateway_secrets is None:
        return "no gateway keys were provided (provision generates them on the control machine)"
    return None


def _hosts(ctx: RoleContext) -> list:  # noqa: ANN202 - inventory hosts
    return list(ctx.inventory.hosts.values())


def router_url(ctx: RoleContext) -> str | None:
    """Where the gateway reaches the P/D pool: the router on this host, when the profile disaggregates."""
    if ctx.profile.pools.prefill is None or ctx.profile.pools.decode is None:
        return None
    return f"http://127.0.0.1:{ctx.profile.gateway.router_port}"


def router_argv(ctx: RoleContext) -> list[str]:
    """vllm-router in P/D mode over every prefill and decode instance of the inventory."""
    kv = ctx.profile.kv_transfer
    argv = [f"{VENV}/bin/vllm-router", "--vllm-pd-disaggregation"]
    bootstrap = kv.bootstrap_port_for("prefill")
    for url in pool_urls(ctx.profile, _hosts(ctx), "prefill"):
        argv += ["--prefill", url] + ([str(bootstrap)] if bootstrap else [])
    for url in pool_urls(ctx.profile, _hosts(ctx), "decode"):
        argv += ["--decode", url]
    argv += [
        "--kv-connector", ROUTER_CONNECTORS.get(kv.connector, "nixl"),
        "--host", "127.0.0.1",
        "--port", str(ctx.profile.gateway.router_port),
        "--prometheus-host", "127.0.0.1",
        "--prometheus-port", str(ctx.profile.gateway.router_prometheus_port),
    ]
    return argv


def gateway_url(ctx: RoleContext) -> str:
    return f"http://{serve_address(ctx.host)}:{ctx.profile.gateway.port}"


def files(ctx: RoleContext) -> list[RenderedFile]:
    if _why_not(ctx):
        return []
    gw = ctx.profile.gateway
    model = ctx.profile.model
    secrets = ctx.gateway_secrets
    assert secrets is not None
    policy = ctx.render(
        "gateway-policy.yaml.j2",
        profile_name=ctx.profile.name,
        version=gw.policy_version,
        listen_host=serve_address(ctx.host),
        port=gw.port,
        admin_port=gw.admin_port,
        keys_file=gw.keys_file,
        alias=gw.model_alias or model.id,
        colocated=pool_urls(ctx.profile, _hosts(ctx), "colocated"),
        disagg=router_url(ctx),
        # the pools serve the alias too (vllm_args.served_model_names): bodies pass through unchanged
        upstream_model=None,
        chars_per_token=gw.chars_per_token,
        long_prompt_tokens=gw.long_prompt_tokens,
        stage=gw.stage,
        stages=gw.stages,
    )
    keys = ctx.render(
        "gateway-keys.yaml.j2", client_sha256=secrets.client_sha256, admin_sha256=secrets.admin_sha256
    )
    owner = {"owner": SERVICE_USER, "group": SERVICE_USER}
    out = [
        RenderedFile(POLICY_FILE, policy, mode="0600", **owner),
        RenderedFile(gw.keys_file, keys, mode="0600", secret=True, **owner),
        RenderedFile(
            f"{UNIT_DIR}/{GATEWAY_UNIT}",
            ctx.render(
                "pdfleet-gateway.service.j2",
                service_user=SERVICE_USER,
                router_unit=ROUTER_UNIT if router_url(ctx) else None,
                argv=[f"{VENV}/bin/pdfleet-gateway", "--config", POLICY_FILE,
                      "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S)],
                check_argv=[f"{VENV}/bin/pdfleet-gateway", "--config", POLICY_FILE, "--check"],
                stop_timeout=SHUTDOWN_TIMEOUT_S + 10,
            ),
        ),
    ]
    if router_url(ctx):
        out.append(
            RenderedFile(
                f"{UNIT_DIR}/{ROUTER_UNIT}",
                ctx.render(
                    "vllm-router-pd.service.j2",
                    service_user=SERVICE_USER,
                    kv_connector=ctx.profile.kv_transfer.connector,
                    argv=router_argv(ctx),
                ),
            )
        )
    return out


def units(ctx: RoleContext) -> list[ManagedUnit]:
    if _why_not(ctx):
        return []
    found = [ManagedUnit(GATEWAY_UNIT, f"{gateway_url(ctx)}/health")]
    if router_url(ctx):
        found.insert(0, ManagedUnit(ROUTER_UNIT, f"{router_url(ctx)}/health"))
    return found


def operations(ctx: RoleContext, facts: FactSource) -> Iterable[Operation | Skip]:
    reason = _why_not(ctx)
    if reason:
        yield Skip("gateway", reason)
        return
    gw = ctx.profile.gateway
    mirrors = ctx.profile.mirrors
    restarts = {u.unit: restart_handler(u.unit, u.health_url, START_TIMEOUT_S) for u in units(ctx)}
    # The gateway keeps its old policy when a new one is bad; checking first makes provision say so.
    check = Run(f"sudo -u {SERVICE_USER} {VENV}/bin/pdfleet-gateway --config {POLICY_FILE} --check")
    reload = Handler(
        f"reload {GATEWAY_UNIT}", (check, Run(f"systemctl reload {GATEWAY_UNIT}")), unit=GATEWAY_UNIT
    )
    yield Directory("/opt/pdfleet", mode="0755")
    find_links: tuple[str, ...] = ()
    if ctx.pdfleet_wheel is not None:  # a site index does not carry this clone's pdfleet: bring it
        yield Directory(WHEEL_DIR, mode="0755")
        yield File(f"{WHEEL_DIR}/{ctx.pdfleet_wheel.name}", ctx.pdfleet_wheel.read_bytes(), mode="0644")
        find_links = (WHEEL_DIR,)
    yield PipRequirements(
        VENV,
        (f"pdfleet=={ctx.pdfleet_version}", f"vllm-router=={gw.router_version}"),
        index_url=mirrors.pypi,
        trusted_host=mirrors.pypi_trusted_host,
        find_links=find_links,
        notify=tuple(restarts.values()),
    )
    yield Directory(CONFIG_DIR, mode="0700", owner=SERVICE_USER, group=SERVICE_USER)
    for rendered in files(ctx):
        name = rendered.path.rsplit("/", 1)[1]
        if rendered.path.startswith(UNIT_DIR):
            yield SystemdUnit(name, rendered.content.encode(), restart=restarts[name])
        else:
            yield File(rendered.path, rendered.content.encode(), mode=rendered.mode, owner=rendered.owner,
                       group=rendered.group, secret=rendered.secret, notify=(reload,))
    for unit in units(ctx):
        yield Service(unit.unit, enabled=True, running=True, health_url=unit.health_url,
                      health_timeout=START_TIMEOUT_S)

"""monitoring: Prometheus and Alertmanager (Debian's packages, from the site's apt repository) on the
monitoring group.

It listens on the host's inventory address, scrapes every metrics endpoint of the topology
(`pdfleet.monitoring.monitoring_config`), records the request chain (`pdfleet.monitoring.recording`)
and alerts on it (`pdfleet.monitoring.alerts`); the Grafana dashboard (`pdfleet.monitoring.dashboard`) is
installed beside the rules for the operator to import. Files are written before the package is
installed, so its first start already uses them (apt keeps our conffiles: --force-confold). A changed
config or rule file is checked with promtool, then reloaded (SIGHUP), never restarted; only changed
daemon flags restart it. Alertmanager (`roles.monitoring.alerting`) takes Prometheus's alerts to the
profile's receivers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pdfleet.fleet.render import RenderedFile
from pdfleet.fleet.roles import ManagedUnit, RoleContext, gateway_ca_files, gateway_ca_operations
from pdfleet.fleet.topology import Prometheus
from pdfleet.monitoring.alerts import alert_rules
from pdfleet.monitoring.dashboard import dashboard_json
from pdfleet.monitoring.monitoring_config import (
    ALERTS_FILE,
    CONFIG_DIR,
    CONFIG_FILE,
    DEFAULTS_FILE,
    RECORDING_FILE,
    RULES_DIR,
    defaults_file,
    dump,
    prometheus_config,
)
from pdfleet.monitoring.recording import recording_rules
from pdfleet.ops.apt import AptPackage, AptPackages, AptUpdate
from pdfleet.ops.base import Fact, FactSource, Handler, Operation, Run, Skip
from pdfleet.ops.files import Directory, File
from pdfleet.ops.systemd import Service, restart_handler
from roles.monitoring import alerting

NAME = "monitoring"
PACKAGE = "prometheus"
APT_PACKAGES: tuple[str, ...] = (PACKAGE, alerting.PACKAGE)
UNIT = "prometheus.service"
DASHBOARD_FILE = f"{RULES_DIR}/grafana-dashboard.json"
START_TIMEOUT_S = 120
HEADER = "# Managed by pdfleet (roles/monitoring); checked with promtool before every reload.\n"


def applies(ctx: RoleContext) -> bool:
    return ctx.topology.prometheus_on(ctx.host.name) is not None


def facts(ctx: RoleContext) -> tuple[Fact[Any], ...]:
    return (AptPackages(),)  # whether Prometheus and Alertmanager are installed yet


def _server(ctx: RoleContext) -> Prometheus:
    server = ctx.topology.prometheus_on(ctx.host.name)
    assert server is not None, "applies() admits only the topology's monitoring hosts"
    return server


def ready_url(ctx: RoleContext) -> str:
    return _server(ctx).ready_url


def check_commands() -> tuple[Run, ...]:
    """promtool on every file Prometheus reads (check config also loads the rule files it names)."""
    return (
        Run(f"promtool check config {CONFIG_FILE}"),
        Run(f"promtool check rules {RECORDING_FILE} {ALERTS_FILE}"),
    )


def files(ctx: RoleContext) -> list[RenderedFile]:
    """Prometheus's files, then Alertmanager's (and the lab recorder's)."""
    return [*prometheus_files(ctx), *alerting.files(ctx)]


def prometheus_files(ctx: RoleContext) -> list[RenderedFile]:
    """The daemon's flags, its config, the recording and alert rules, and the dashboard."""
    has_gateway = bool(ctx.topology.gateways)
    profile = ctx.profile
    # by model: each P/D model's connector's KV series, each model's alerts against its own SLO, the
    # dashboard's model variable over every model (every target carries its model's label)
    return [
        RenderedFile(DEFAULTS_FILE, defaults_file(profile, _server(ctx))),
        RenderedFile(CONFIG_FILE, prometheus_config(profile, ctx.topology, _server(ctx))),
        RenderedFile(RECORDING_FILE, HEADER + dump(recording_rules(profile, has_gateway))),
        RenderedFile(ALERTS_FILE, HEADER + dump(alert_rules(profile, has_gateway))),
        RenderedFile(DASHBOARD_FILE, dashboard_json(profile, ctx.topology)),
        *gateway_ca_files(ctx),
    ]


def units(ctx: RoleContext) -> list[ManagedUnit]:
    return [ManagedUnit(UNIT, _server(ctx).port, ready_url(ctx)), *alerting.units(ctx)]


def handlers(ctx: RoleContext) -> tuple[Handler, Handler]:
    """(restart for changed flags, reload for changed config or rules), each after promtool passes."""
    restart = restart_handler(UNIT, ready_url(ctx), START_TIMEOUT_S)
    restart = Handler(restart.name, (*check_commands(), *restart.commands), unit=UNIT)
    reload = Handler(f"reload {UNIT}", (*check_commands(), Run(f"systemctl reload {UNIT}")), unit=UNIT)
    return restart, reload


def operations(ctx: RoleContext, facts: FactSource) -> Iterable[Operation | Skip]:
    restart, reload = handlers(ctx)
    yield from gateway_ca_operations(ctx, notify=(reload,))  # what the gateway job's tls_config names
    yield Directory(CONFIG_DIR, mode="0755")
    yield Directory(RULES_DIR, mode="0755")
    for rendered in prometheus_files(ctx):
        if rendered.path == DEFAULTS_FILE:
            notify: tuple[Handler, ...] = (restart,)
        elif rendered.path == DASHBOARD_FILE:
            notify = ()  # Prometheus does not read it
        else:
            notify = (reload,)
        yield File(rendered.path, rendered.content.encode(), mode=rendered.mode, notify=notify)
    yield from alerting.config_operations(ctx)
    installed = facts.get(AptPackages())
    if any(installed.get(p) is None for p in APT_PACKAGES):
        yield AptUpdate(max_age_minutes=0)  # the mirror may have gained the packages since the last update
    yield AptPackage(PACKAGE)
    yield Service(UNIT, enabled=True, running=True, health_url=ready_url(ctx), health_timeout=START_TIMEOUT_S)
    yield from alerting.service_operations(ctx)

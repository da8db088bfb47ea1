"""monitoring's Alertmanager half: Debian's `prometheus-alertmanager` beside Prometheus, the receivers'
secrets in 0600 files only Alertmanager's user reads, and the lab's notification recorder where the
profile asks for it.

Like Prometheus's files, Alertmanager's are written before its package is installed (its first start uses
them); a changed alertmanager.yml is checked with amtool, then reloaded (SIGHUP), changed flags restart
it. The secret files are written once the package made the `prometheus` user; Alertmanager reads them
when it sends, so a changed secret needs no reload.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable

from pdfleet.fleet.host_layout import UNIT_DIR
from pdfleet.fleet.render import RenderedFile
from pdfleet.fleet.roles import ManagedUnit, RoleContext
from pdfleet.fleet.topology import Alertmanager
from pdfleet.monitoring import notification_recorder
from pdfleet.monitoring.alertmanager_config import (
    AM_CONFIG_FILE,
    AM_DEFAULTS_FILE,
    AM_SECRETS_DIR,
    AM_USER,
    alertmanager_config,
    alertmanager_defaults,
    secret_files,
)
from pdfleet.ops.apt import AptPackage
from pdfleet.ops.base import Handler, Operation, Run, Skip
from pdfleet.ops.files import Directory, File
from pdfleet.ops.systemd import Service, SystemdUnit, restart_handler

PACKAGE = "prometheus-alertmanager"
UNIT = "prometheus-alertmanager.service"
RECORDER_UNIT = "pdfleet-notification-recorder.service"
RECORDER_FILE = "/usr/local/lib/pdfleet/notification_recorder.py"
START_TIMEOUT_S = 60


def _am(ctx: RoleContext) -> Alertmanager:
    server = ctx.topology.prometheus_on(ctx.host.name)
    assert server is not None and server.alertmanager is not None, "a monitoring host's Alertmanager"
    return server.alertmanager


def ready_url(am: Alertmanager) -> str:
    return f"{am.url}/-/ready"


def check_command() -> Run:
    """amtool on the config Alertmanager reads (receivers, routes, inhibition)."""
    return Run(f"amtool check-config {AM_CONFIG_FILE}")


def recorder_argv(am: Alertmanager) -> list[str]:
    assert am.recorder_port is not None
    return ["/usr/bin/python3", RECORDER_FILE, "--address", am.address, "--port", str(am.recorder_port)]


def files(ctx: RoleContext) -> list[RenderedFile]:
    """The daemon's flags and config, and the lab recorder's program and unit (never a secret)."""
    return [*config_files(ctx), *recorder_files(ctx)]


def config_files(ctx: RoleContext) -> list[RenderedFile]:
    am = _am(ctx)
    return [
        RenderedFile(AM_DEFAULTS_FILE, alertmanager_defaults(am)),
        RenderedFile(AM_CONFIG_FILE, alertmanager_config(ctx.profile, am)),
    ]


def recorder_files(ctx: RoleContext) -> list[RenderedFile]:
    """The lab recorder's program (this module's source, as it is) and unit; none unless asked for."""
    am = _am(ctx)
    if am.recorder_port is None:
        return []
    unit = ctx.render("pdfleet-notification-recorder.service.j2", argv=recorder_argv(am))
    return [
        RenderedFile(RECORDER_FILE, inspect.getsource(notification_recorder)),
        RenderedFile(f"{UNIT_DIR}/{RECORDER_UNIT}", unit),
    ]


def units(ctx: RoleContext) -> list[ManagedUnit]:
    am = _am(ctx)
    out = [ManagedUnit(UNIT, am.port, ready_url(am))]
    if am.recorder_url is not None:
        out.append(ManagedUnit(RECORDER_UNIT, am.recorder_port, f"{am.recorder_url}/health"))
    return out


def handlers(ctx: RoleContext) -> tuple[Handler, Handler]:
    """(restart for changed flags, reload for a changed config), each after amtool passes."""
    restart = restart_handler(UNIT, ready_url(_am(ctx)), START_TIMEOUT_S)
    restart = Handler(restart.name, (check_command(), *restart.commands), unit=UNIT)
    reload = Handler(f"reload {UNIT}", (check_command(), Run(f"systemctl reload {UNIT}")), unit=UNIT)
    return restart, reload


def config_operations(ctx: RoleContext) -> Iterable[Operation]:
    """Alertmanager's flags and config, before its package (its first start reads them)."""
    restart, reload = handlers(ctx)
    for rendered in config_files(ctx):
        notify = (restart,) if rendered.path == AM_DEFAULTS_FILE else (reload,)
        yield File(rendered.path, rendered.content.encode(), notify=notify)


def service_operations(ctx: RoleContext) -> Iterable[Operation | Skip]:
    """After the packages: the secrets (the package made their owner), Alertmanager running, the recorder."""
    am = _am(ctx)
    secrets = secret_files(ctx.profile, ctx.alert_secrets)
    yield Directory(AM_SECRETS_DIR, mode="0700", owner=AM_USER, group=AM_USER)
    for path, content in secrets:
        yield File(path, content.encode(), mode="0600", owner=AM_USER, group=AM_USER, secret=True)
    yield AptPackage(PACKAGE)
    yield Service(UNIT, enabled=True, running=True, health_url=ready_url(am), health_timeout=START_TIMEOUT_S)
    if am.recorder_url is None:
        return
    program, unit = recorder_files(ctx)
    restart = restart_handler(RECORDER_UNIT, f"{am.recorder_url}/health", START_TIMEOUT_S)
    yield Directory(program.path.rsplit("/", 1)[0], mode="0755")
    yield File(program.path, program.content.encode(), notify=(restart,))
    yield SystemdUnit(RECORDER_UNIT, unit.content, restart=restart)
    yield Service(RECORDER_UNIT, health_url=f"{am.recorder_url}/health", health_timeout=START_TIMEOUT_S)

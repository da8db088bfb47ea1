"""The fleet runner: plan every host, then apply in parallel (in waves with `serial`).

Per host: connect, run the planner against lazily gathered facts, plan every operation, and
(unless `check`) apply the changes in order, then the notified handlers once (daemon-reload
first; a restart of a unit this run started is skipped). A host's failure is recorded with its
reason and never stops another host. The caller decides the exit code from the report's totals.
"""

from __future__ import annotations

import contextlib
import functools
import json
import shlex
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, TypeVar

from pdfleet.errors import PdfleetError
from pdfleet.ops.base import (
    DAEMON_RELOAD,
    REBOOT_REQUIRED,
    Change,
    Command,
    Fact,
    FactSource,
    Handler,
    Operation,
    Push,
    Run,
    Skip,
    Upload,
)
from pdfleet.ops.gather import HostFacts, PlannedFacts, gather_for
from pdfleet.ops.ssh import Transport, open_connection
from pdfleet.ops.transfer import Emit, push, watched_run

if TYPE_CHECKING:
    from pdfleet.model.inventory import Host

Planner = Callable[["Host", FactSource], Iterable[Operation | Skip]]
# The host-wide facts a planner reads before it yields operations (hardware, installed packages): they
# go in a host's first fact batch, with the sudo check that batch implies.
Prefetch = Callable[["Host"], Iterable[Fact[Any]]]
Progress = Callable[[str, str], None]  # (host name, message)
RunConnect = Callable[["Host", "RunOptions"], Transport]

ERROR_TAIL_LINES = 20
REBOOT_POLL_S = 5.0
T = TypeVar("T")


@dataclass
class RunOptions:
    """How a fleet run behaves (CLI options and invoke.yaml settings)."""

    check: bool = False
    serial: int | None = None
    known_hosts: str = "~/.ssh/known_hosts"
    connect_timeout: float = 10.0
    json_path: Path | None = None
    reboot: bool = False  # act on a role's "reboot required" marker: reboot, wait for SSH, converge
    reboot_timeout: float = 900.0
    command_timeout: float | None = 3600.0  # per command; health waits carry their own limit
    max_parallel: int = 32


class CommandError(PdfleetError):
    """A command on a host exited non-zero."""


@dataclass
class HostReport:
    """What happened on one host."""

    name: str
    ok: int = 0
    changed: int = 0
    skipped: int = 0
    failed: int = 0
    changes: list[dict[str, str]] = field(default_factory=list)
    error: str | None = None
    skips: list[Skip] = field(default_factory=list)
    rebooted: bool = False

    @property
    def reboot_reasons(self) -> list[str]:
        """Why the host needs a reboot (roles' REBOOT_REQUIRED markers), if it does."""
        return [s.reason for s in self.skips if s.what == REBOOT_REQUIRED]

    def fail(self, reason: str) -> None:
        """Mark the host failed with its reason."""
        self.failed = 1
        self.error = reason

    def to_json(self) -> dict[str, Any]:
        """The host's entry in the JSON report."""
        return {
            "ok": self.ok,
            "changed": self.changed,
            "skipped": self.skipped,
            "failed": self.failed,
            "changes": list(self.changes),
            "error": self.error,
            # only when a reboot is involved, so the agreed shape stays as it is for every other run
            **({"reboot_required": self.reboot_reasons} if self.reboot_reasons else {}),
            **({"rebooted": True} if self.rebooted else {}),
        }


@dataclass
class Report:
    """The outcome of a fleet run, per host in inventory order."""

    hosts: dict[str, HostReport]
    check: bool = False

    @property
    def totals(self) -> dict[str, int]:
        """Sums of ok/changed/skipped/failed over hosts."""
        keys = ("ok", "changed", "skipped", "failed")
        return {k: sum(getattr(h, k) for h in self.hosts.values()) for k in keys}

    def to_json(self) -> dict[str, Any]:
        """`{"hosts": {HOST: {...}}, "totals": {...}}`."""
        return {"hosts": {n: h.to_json() for n, h in self.hosts.items()}, "totals": self.totals}

    def write_json(self, path: Path) -> None:
        """Write the JSON report (parents created)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n", encoding="utf-8")


@dataclass
class _HostRun:
    """One host's state between planning and applying."""

    host: Host
    report: HostReport
    transport: Transport | None = None
    plan: list[tuple[Operation, list[Change]]] = field(default_factory=list)


def _tail(text: str, lines: int = ERROR_TAIL_LINES) -> str:
    """The last lines of command output, enough to explain a failure without flooding the report."""
    return "\n".join(text.strip().splitlines()[-lines:])


def describe_command(cmd: Command) -> str:
    """A command as shown in errors (uploads never show content)."""
    if isinstance(cmd, Run):
        return cmd.cmd
    if isinstance(cmd, Push):
        return f"push {cmd.source} to {cmd.dest}"
    return f"upload {cmd.dest} (mode {cmd.mode}, {cmd.owner}:{cmd.group})"


def install_command(tmp: str, upload: Upload) -> str:
    """Move a staged upload into place atomically with its mode and owner, then remove the temp file.

    `install` writes a sibling temp file (same filesystem), `mv -T` renames it over the target,
    so readers see the old or the new file, never a partial one.
    """
    dest = PurePosixPath(upload.dest)
    staged = str(dest.parent / f".{dest.name}.pdfleet-tmp")
    q = shlex.quote
    return (
        f"install -D -m {q(upload.mode)} -o {q(upload.owner)} -g {q(upload.group)} {q(tmp)} {q(staged)} "
        f"&& mv -fT {q(staged)} {q(upload.dest)}; rc=$?; rm -f {q(tmp)}; exit $rc"
    )


def execute(transport: Transport, cmd: Command, timeout: float | None, emit: Emit | None = None) -> None:
    """Run one command on the host; a non-zero exit raises CommandError with stderr (and diagnostics).
    `emit` receives progress lines of the long copies (pushes, watched downloads)."""
    on_fail = None
    if isinstance(cmd, Upload):
        tmp = transport.put(cmd.content)
        out = transport.run(install_command(tmp, cmd), sudo=True, timeout=timeout)
    elif isinstance(cmd, Push):
        out = push(transport, cmd, timeout, emit)
    elif cmd.watch is not None and emit is not None:
        out = watched_run(transport, cmd, timeout, emit)
        on_fail = cmd.on_fail
    else:
        out = transport.run(cmd.cmd, sudo=cmd.sudo, timeout=timeout)
        on_fail = cmd.on_fail
    if out.rc == 0:
        return
    message = f"`{describe_command(cmd)}` exited {out.rc}"
    detail = _tail(out.stderr) or _tail(out.stdout)
    if detail:
        message += f": {detail}"
    if on_fail:
        diag = transport.run(on_fail, sudo=True, timeout=60)
        message += f"\n--- {on_fail} ---\n{_tail(diag.stdout + diag.stderr, 30)}"
    raise CommandError(message)


def _connect(host: Host, options: RunOptions) -> Transport:
    """The default connector: SSH with the run's known_hosts and timeout (the first fact batch, run
    through sudo, is the sudo check)."""
    return open_connection(host, options.known_hosts, options.connect_timeout, check_sudo=False)


def _plan_host(
    run: _HostRun, planner: Planner, options: RunOptions, connect: RunConnect, prefetch: Prefetch | None
) -> None:
    """Connect and plan every operation for one host; failures land in its report."""
    report = run.report
    try:
        run.transport = connect(run.host, options)
    except PdfleetError as exc:
        report.fail(str(exc))
        return
    except Exception as exc:  # any connect failure is this host's failure only
        report.fail(f"cannot connect to {run.host.name}: {exc}")
        return
    _plan_connected(run, planner, options, prefetch)


def _plan_connected(run: _HostRun, planner: Planner, options: RunOptions, prefetch: Prefetch | None) -> None:
    """Plan every operation on an open connection, against freshly gathered facts (batched first)."""
    report = run.report
    assert run.transport is not None
    host_facts = HostFacts(run.transport, timeout=options.command_timeout)
    facts = PlannedFacts(host_facts)
    current = "gathering facts"
    try:
        gather_for(host_facts, planner, run.host, prefetch)
        current = "planner"
        for item in planner(run.host, facts):
            if isinstance(item, Skip):
                report.skipped += 1
                report.skips.append(item)
                continue
            current = item.describe()
            changes = item.plan(facts)
            facts.record(changes)
            if changes:
                run.plan.append((item, changes))
                if options.check:
                    report.changed += 1
                    report.changes += [{"op": c.op, "diff": c.diff} for c in changes]
            else:
                report.ok += 1
            current = "planner"
    except Exception as exc:  # a bad op or fact fails this host, not the run
        report.fail(f"{current}: {exc}")


def _apply_host(run: _HostRun, options: RunOptions, progress: Progress | None) -> None:
    """Apply a planned host's changes in order, then its handlers."""
    report = run.report
    transport = run.transport
    assert transport is not None
    pending: list[Handler] = []
    started: set[str] = set()
    current = ""
    emit = functools.partial(progress, run.host.name) if progress else None
    try:
        for op, changes in run.plan:
            current = op.describe()
            if progress:
                progress(run.host.name, f"applying {current}")
            for change in changes:
                for handler in change.flush:
                    if _pop_handler(pending, handler):
                        _run_handler(transport, handler, options)
                for cmd in change.commands:
                    execute(transport, cmd, options.command_timeout, emit)
                if change.starts_unit:
                    started.add(change.starts_unit)
                for handler in change.notify:
                    if all(h.name != handler.name for h in pending):
                        pending.append(handler)
                report.changes.append({"op": change.op, "diff": change.diff})
            report.changed += 1
        for handler in _handler_order(pending):
            current = f"handler {handler.name}"
            if handler.unit and handler.unit in started:
                if progress:
                    progress(run.host.name, f"skip {handler.name}: started in this run")
                continue
            if progress:
                progress(run.host.name, f"running {current}")
            _run_handler(transport, handler, options)
    except Exception as exc:  # recorded per host; other hosts carry on
        report.fail(f"{current}: {exc}")


BOOT_ID = "cat /proc/sys/kernel/random/boot_id"


def _reboot_and_converge(
    run: _HostRun,
    planner: Planner,
    options: RunOptions,
    connect: RunConnect,
    progress: Progress | None,
    prefetch: Prefetch | None = None,
) -> None:
    """After applying: if the host now needs a reboot, reboot it, wait for SSH on a new boot, converge."""
    check = _HostRun(run.host, HostReport(run.host.name), transport=run.transport)
    _plan_connected(check, planner, options, prefetch)
    reasons = check.report.reboot_reasons
    if check.report.error or not reasons:
        run.report.skips = check.report.skips  # the state after this run, not before it
        return
    assert run.transport is not None
    if progress:
        progress(run.host.name, f"rebooting: {'; '.join(reasons)}")
    old_boot = run.transport.run(BOOT_ID).stdout.strip()
    with contextlib.suppress(Exception):  # the connection may drop before the command returns
        run.transport.run("systemctl reboot", sudo=True, timeout=30)
    with contextlib.suppress(Exception):
        run.transport.close()
    run.transport = _wait_for_new_boot(run.host, options, connect, old_boot)
    run.report.rebooted = True
    after = _HostRun(run.host, HostReport(run.host.name), transport=run.transport)
    _plan_connected(after, planner, options, prefetch)
    if after.report.error is None:
        _apply_host(after, options, progress)
    _merge_after_reboot(run.report, after.report)


def _wait_for_new_boot(host: Host, options: RunOptions, connect: RunConnect, old_boot: str) -> Transport:
    """Reconnect once the host answers SSH with a different boot id; CommandError after the timeout."""
    deadline = time.monotonic() + options.reboot_timeout
    while time.monotonic() < deadline:
        time.sleep(REBOOT_POLL_S)
        try:
            transport = connect(host, options)
        except Exception:  # still down: keep polling until the deadline
            continue
        if transport.run(BOOT_ID).stdout.strip() not in ("", old_boot):
            return transport
        transport.close()
    raise CommandError(f"{host.name} did not come back from reboot within {options.reboot_timeout:.0f}s")


def _merge_after_reboot(report: HostReport, after: HostReport) -> None:
    """The host's final state is the post-reboot pass; its changes add to the first pass's."""
    report.ok = after.ok
    report.changed += after.changed
    report.skipped = after.skipped
    report.skips = after.skips
    report.changes += after.changes
    if after.error:
        report.fail(f"after reboot: {after.error}")


def _pop_handler(pending: list[Handler], handler: Handler) -> bool:
    """Remove a pending handler by name; whether it was pending."""
    for i, h in enumerate(pending):
        if h.name == handler.name:
            del pending[i]
            return True
    return False


def _handler_order(pending: list[Handler]) -> list[Handler]:
    """daemon-reload first (restarts need the new unit files), then in notification order."""
    return sorted(pending, key=lambda h: h.name != DAEMON_RELOAD.name)


def _run_handler(transport: Transport, handler: Handler, options: RunOptions) -> None:
    """Run a handler's commands in order; the first failure raises."""
    for cmd in handler.commands:
        execute(transport, cmd, options.command_timeout)


def _summary(report: HostReport, check: bool) -> str:
    """The one progress line that ends a host's plan or apply."""
    if report.error:
        return f"FAILED: {report.error.splitlines()[0]}"
    verb = "would change" if check else "changed"
    return f"ok={report.ok} {verb}={report.changed} skipped={report.skipped}"


def _waves(runs: list[_HostRun], serial: int | None) -> list[list[_HostRun]]:
    """Hosts in waves of `serial` (all at once when unset)."""
    if not serial or serial <= 0:
        return [runs] if runs else []
    return [runs[i : i + serial] for i in range(0, len(runs), serial)]


def run_fleet(
    hosts: Sequence[Host],
    planner: Planner,
    options: RunOptions,
    progress: Progress | None = None,
    connect: RunConnect | None = None,
    prefetch: Prefetch | None = None,
) -> Report:
    """Plan every host (parallel), then apply unless `check` (parallel, in waves of `serial`)."""
    connector = connect or _connect
    runs = [_HostRun(h, HostReport(h.name)) for h in hosts]
    workers = max(1, min(options.max_parallel, len(runs)))
    try:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pdfleet-plan") as pool:

            def plan_one(run: _HostRun) -> None:
                _plan_host(run, planner, options, connector, prefetch)
                if progress:
                    msg = _summary(run.report, True) if run.report.error or options.check else None
                    progress(run.host.name, msg or f"planned: {len(run.plan)} operation(s) to change")

            list(pool.map(plan_one, runs))
            if not options.check:
                ready = [r for r in runs if r.report.error is None]
                for wave in _waves(ready, options.serial):

                    def apply_one(run: _HostRun) -> None:
                        _apply_host(run, options, progress)
                        if options.reboot and run.report.error is None:
                            try:
                                _reboot_and_converge(run, planner, options, connector, progress, prefetch)
                            except Exception as exc:  # this host's failure only
                                run.report.fail(f"reboot: {exc}")
                        if progress:
                            progress(run.host.name, _summary(run.report, False))

                    list(pool.map(apply_one, wave))
    finally:
        for run in runs:
            if run.transport is not None:
                # closing a dead connection must not mask the results
                with contextlib.suppress(Exception):
                    run.transport.close()
    report = Report({r.host.name: r.report for r in runs}, check=options.check)
    if options.json_path:
        report.write_json(options.json_path)
    return report

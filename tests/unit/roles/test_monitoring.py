"""The monitoring role: what it renders passes promtool for every profile and inventory that deploy
together, and its operations check before they reload, reload rather than restart, and converge."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

import roles.monitoring as monitoring
from pdfleet.fleet.deployment import Deployment
from pdfleet.fleet.roles import RoleContext
from pdfleet.monitoring.monitoring_config import ALERTS_FILE, CONFIG_FILE, DEFAULTS_FILE, RECORDING_FILE
from pdfleet.ops.apt import AptPackage, AptPackages, AptUpdate, CommandRc
from pdfleet.ops.base import FakeFacts, Operation, Run
from pdfleet.ops.files import Directory, DirectoryState, File, FileContent, FileState, PathInfo
from pdfleet.ops.systemd import Service, SystemdUnit
from pdfleet.ops.unit_health import UnitHealth, UnitState
from tests.unit.fleet.helpers import fleet_of, profile_inventory_pairs
from tests.unit.metrics.helpers import check_config_tree
from tests.unit.roles.helpers import deployment

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py

PAIRS = [(p, i) for p, i in profile_inventory_pairs() if "monitoring" in i.read_text()]


def _monitoring_contexts(fleet: Deployment) -> list[RoleContext]:
    return [fleet.context(h) for h in fleet.inventory.hosts.values() if h.in_group("monitoring")]


@pytest.mark.parametrize(("profile", "inventory"), PAIRS, ids=lambda v: v if isinstance(v, str) else v.name)
def test_rendered_config_and_rules_pass_promtool(profile: str, inventory: Path, tmp_path: Path) -> None:
    contexts = _monitoring_contexts(fleet_of(profile, inventory))
    assert contexts, f"{inventory.name} has a monitoring group"
    for ctx in contexts:
        files = {f.path: f.content for f in monitoring.files(ctx)}
        checked = check_config_tree(files[CONFIG_FILE], files, tmp_path / ctx.host.name)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        # `check config` runs `check rules` on every rule file the config names: both must be among them
        for rules in (RECORDING_FILE, ALERTS_FILE):
            path = tmp_path / ctx.host.name / rules.lstrip("/")
            assert re.search(
                rf"Checking {re.escape(str(path))}\n\s*SUCCESS: \d+ rules found", checked.stdout
            ), f"{rules} not checked as a rule file: {checked.stdout}"


def test_prometheus_listens_on_the_host_address_with_the_profile_retention() -> None:
    ctx = deployment("lab-cross").context(deployment("lab-cross").inventory.hosts["lab-gw"])
    defaults = next(f.content for f in monitoring.files(ctx) if f.path == DEFAULTS_FILE)
    args = defaults.split('ARGS="', 1)[1].split('"', 1)[0].split()
    mon = ctx.profile.monitoring
    assert f"--web.listen-address={ctx.host.address}:{mon.port}" in args
    assert f"--storage.tsdb.retention.time={mon.retention_days}d" in args
    assert f"--config.file={CONFIG_FILE}" in args
    assert monitoring.units(ctx)[0].health_url == f"http://{ctx.host.address}:{mon.port}/-/ready"


def test_only_monitoring_hosts_get_it_and_the_mirror_carries_the_package() -> None:
    fleet = deployment("lab-cross")
    assert [h.name for h in fleet.inventory.hosts.values() if monitoring.applies(fleet.context(h))] == [
        "lab-gw"
    ]
    assert monitoring.APT_PACKAGES == ("prometheus", "prometheus-alertmanager")
    from pdfleet.fleet.roles import apt_packages
    from roles import REGISTRY

    # what lab.up's apt mirror is built from
    assert {"prometheus", "prometheus-alertmanager", "prometheus-node-exporter"} <= set(
        apt_packages(REGISTRY)
    )


INSTALLED = {"prometheus": "2.42", "prometheus-alertmanager": "0.25"}


def _info(content: str | bytes, mode: str = "0644") -> PathInfo:
    data = content.encode() if isinstance(content, str) else content
    return PathInfo("file", mode, "root", "root", len(data), hashlib.sha256(data).hexdigest())


def _converged(ops: list[Any]) -> dict[Any, Any]:
    """Facts of a host on which these operations already ran."""
    table: dict[Any, Any] = {
        AptPackages(): {"prometheus": "2.42.0+ds-5+deb12u1", "prometheus-alertmanager": "0.25.0-1+b4"}
    }
    for op in ops:
        if isinstance(op, File):
            table[FileState(op.path)] = _info(op.content, op.mode)
        elif isinstance(op, Directory):
            table[DirectoryState(op.path)] = PathInfo("directory", op.mode, op.owner, op.group, 0, None)
        elif isinstance(op, SystemdUnit):
            table[FileState(f"{op.directory}/{op.name}")] = _info(op.content)
        elif isinstance(op, Service):
            table[UnitHealth(op.unit)] = UnitState("loaded", "active", "running", "enabled")
    return table


def _plan(ctx: RoleContext, table: dict[Any, Any]) -> list[tuple[Operation, list[Any]]]:
    facts = FakeFacts(table)
    return [(op, op.plan(facts)) for op in monitoring.operations(ctx, facts) if isinstance(op, Operation)]


def _lab_gw() -> RoleContext:
    fleet = deployment("lab-cross")
    return fleet.context(fleet.inventory.hosts["lab-gw"])


def test_a_second_run_changes_nothing() -> None:
    ctx = _lab_gw()
    ops = [
        op
        for op in monitoring.operations(ctx, FakeFacts({AptPackages(): INSTALLED}))
        if isinstance(op, Operation)
    ]
    assert not [c for _, changes in _plan(ctx, _converged(ops)) for c in changes]


def test_a_changed_rule_file_is_checked_then_reloaded_not_restarted() -> None:
    ctx = _lab_gw()
    ops = [
        op
        for op in monitoring.operations(ctx, FakeFacts({AptPackages(): INSTALLED}))
        if isinstance(op, Operation)
    ]
    table = _converged(ops)
    table[FileState(ALERTS_FILE)] = _info("groups: []\n")
    table[FileContent(ALERTS_FILE)] = "groups: []\n"
    changes = [c for _, cs in _plan(ctx, table) for c in cs]
    assert [c.op for c in changes] == [f"file {ALERTS_FILE}"]
    (handler,) = changes[0].notify
    cmds = [c.cmd for c in handler.commands if isinstance(c, Run)]
    assert cmds == [
        f"promtool check config {CONFIG_FILE}",
        f"promtool check rules {RECORDING_FILE} {ALERTS_FILE}",
        "systemctl reload prometheus.service",
    ]
    assert not any("restart" in c for c in cmds)


def test_changed_daemon_flags_restart_after_promtool() -> None:
    ctx = _lab_gw()
    ops = [
        op
        for op in monitoring.operations(ctx, FakeFacts({AptPackages(): INSTALLED}))
        if isinstance(op, Operation)
    ]
    table = _converged(ops)
    table[FileState(DEFAULTS_FILE)] = _info('ARGS=""\n')
    table[FileContent(DEFAULTS_FILE)] = 'ARGS=""\n'
    (change,) = [c for _, cs in _plan(ctx, table) for c in cs]
    (handler,) = change.notify
    cmds = [c.cmd for c in handler.commands if isinstance(c, Run)]
    assert cmds[0].startswith("promtool check config") and "restart prometheus.service" in cmds[2]


def test_first_install_writes_the_files_before_the_package_starts() -> None:
    """Debian's postinst starts Prometheus: our config must already be there (apt keeps it: confold)."""
    ctx = _lab_gw()
    table: dict[Any, Any] = {
        AptPackages(): {},
        CommandRc(
            "find /var/lib/apt/lists -maxdepth 1 -name '*_Packages*' -mmin -0 2>/dev/null | grep -q ."
        ): 1,
        UnitHealth("prometheus.service"): UnitState("not-found", "inactive", "dead", ""),
    }
    ops = list(monitoring.operations(ctx, FakeFacts(table)))
    kinds = [type(op) for op in ops]
    package = kinds.index(AptPackage)
    # the daemons' flags and configs (Alertmanager's too); the lab recorder's program is no package's
    configs = [i for i, op in enumerate(ops) if isinstance(op, File) and op.path.startswith("/etc/")]
    assert configs and max(configs) < kinds.index(AptUpdate) < package < kinds.index(Service)
    am_package = next(
        i for i, op in enumerate(ops) if isinstance(op, AptPackage) and "alertmanager" in op.name
    )
    assert max(configs) < am_package


def test_scrape_config_names_every_endpoint_with_its_labels() -> None:
    ctx = _lab_gw()
    config = yaml.safe_load(next(f.content for f in monitoring.files(ctx) if f.path == CONFIG_FILE))
    targets = {
        (job["job_name"], t, tuple(sorted(s["labels"].items())))
        for job in config["scrape_configs"]
        for s in job["static_configs"]
        for t in s["targets"]
    }
    for e in ctx.topology.metrics_endpoints:
        labels = tuple(sorted({**e.labels, "instance": f"{e.host}:{e.port}"}.items()))
        assert (e.job, f"{e.address}:{e.port}", labels) in targets
    assert {j["job_name"] for j in config["scrape_configs"]} == {
        "prometheus",
        "vllm",
        "vllm-router",
        "pdfleet-gateway",
        "node",
    }
    # the router's metrics port is reachable from the monitoring host: not loopback
    router = next(j for j in config["scrape_configs"] if j["job_name"] == "vllm-router")
    assert router["static_configs"][0]["targets"] == ["198.18.0.10:29000"]

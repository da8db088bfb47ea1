"""node_exporter: Debian's `prometheus-node-exporter` on every host, listening on the host's inventory
address and `monitoring.node_exporter_port` (the topology's `node` endpoint), scraped by Prometheus with
the labels of what the host runs (`host`, `role`, `pool`): CPU, memory, filesystems, disks and every
network device, the RDMA netdev included, and the RDMA ports' counters (its infiniband collector reads
/sys/class/infiniband, where RoCE traffic is counted).

NVIDIA's DCGM exporter (GPU utilisation and memory beside vLLM's metrics) is not installed: no mirror the
fleet's profiles name carries it (it is not in Debian); `operations` says so on every GPU host. The flags
file is written before the package is installed (its first start listens where it should); a changed
one restarts the exporter.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pdfleet.fleet.render import RenderedFile
from pdfleet.fleet.roles import ManagedUnit, RoleContext
from pdfleet.fleet.topology import MetricsEndpoint
from pdfleet.ops.apt import AptPackage, AptPackages, AptUpdate
from pdfleet.ops.base import Fact, FactSource, Operation, Skip
from pdfleet.ops.files import File
from pdfleet.ops.systemd import Service, restart_handler

NAME = "node_exporter"
PACKAGE = "prometheus-node-exporter"
APT_PACKAGES: tuple[str, ...] = (PACKAGE,)
UNIT = "prometheus-node-exporter.service"
DEFAULTS_FILE = "/etc/default/prometheus-node-exporter"  # Debian's unit reads ARGS from here
START_TIMEOUT_S = 60
DCGM_SKIPPED = (
    "NVIDIA's DCGM exporter (GPU utilisation and memory): no mirror of this fleet carries it (it is not in "
    "Debian; NVIDIA ships it as a container and in its CUDA repository)"
)


def applies(ctx: RoleContext) -> bool:
    return True  # every host: a full disk or a saturated NIC anywhere matters


def facts(ctx: RoleContext) -> tuple[Fact[Any], ...]:
    return (AptPackages(),)  # whether the exporter is installed yet


def endpoint(ctx: RoleContext) -> MetricsEndpoint:
    return next(e for e in ctx.topology.node_exporters if e.host == ctx.host.name)


def exporter_args(ctx: RoleContext) -> list[str]:
    """The exporter's flags: where it listens, and the collectors the profile turns off among Debian's
    defaults (`monitoring.node_exporter_collectors_off`)."""
    e = endpoint(ctx)
    off = [f"--no-collector.{name}" for name in ctx.profile.monitoring.node_exporter_collectors_off]
    return [*off, f"--web.listen-address={e.address}:{e.port}"]


def files(ctx: RoleContext) -> list[RenderedFile]:
    args = " ".join(exporter_args(ctx))
    return [RenderedFile(DEFAULTS_FILE, f'# Managed by pdfleet (roles/node_exporter).\nARGS="{args}"\n')]


def units(ctx: RoleContext) -> list[ManagedUnit]:
    e = endpoint(ctx)
    return [ManagedUnit(UNIT, e.port, e.url)]


def operations(ctx: RoleContext, facts: FactSource) -> Iterable[Operation | Skip]:
    e = endpoint(ctx)
    restart = restart_handler(UNIT, e.url, START_TIMEOUT_S)
    for rendered in files(ctx):
        yield File(rendered.path, rendered.content.encode(), mode=rendered.mode, notify=(restart,))
    if facts.get(AptPackages()).get(PACKAGE) is None:
        yield AptUpdate(max_age_minutes=0)  # the mirror may have gained the package since the last update
    yield AptPackage(PACKAGE)
    yield Service(UNIT, enabled=True, running=True, health_url=e.url, health_timeout=START_TIMEOUT_S)
    if ctx.host.gpus and ctx.instances:
        yield Skip("dcgm exporter", DCGM_SKIPPED)

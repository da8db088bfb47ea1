"""`invoke verify`: testinfra checks of every selected host; a host × check table, optional JUnit XML."""

from __future__ import annotations

from typing import TYPE_CHECKING

from invoke import Context, task
from invoke.exceptions import Exit

from pdfleet.cli import lab_site
from pdfleet.cli.exits import user_errors
from pdfleet.cli.options import HELP, open_deployment
from pdfleet.cli.settings import Settings, repo_path

if TYPE_CHECKING:  # imported when a task runs (pdfleet/cli/__init__.py)
    from pdfleet.fleet.roles import ManagedUnit
    from pdfleet.model.inventory import Host


@task(
    positional=[],  # `invoke TASK --help` is help, not a profile named --help
    help={
        "profile": HELP["profile"],
        "inventory": HELP["inventory"],
        "limit": HELP["limit"],
        "junit": "Also write the results as JUnit XML to this path.",
        "rdma_bandwidth": "Also run ib_write_bw between each prefill/decode host pair against "
        "rdma.min_bandwidth_gbps.",
        "kv_path": "Also move a 64 MiB DRAM buffer with the connector's library (NIXL or Mooncake's "
        "engine) between each prefill/decode host pair: throughput, setup time, and the fix when it fails "
        "or is far below the link.",
        "checks": "Only checks matching this pytest -k expression (e.g. 'services or kv').",
    },
)
@user_errors
def verify(
    ctx: Context,
    profile: str,
    inventory: str | None = None,
    limit: str | None = None,
    junit: str | None = None,
    rdma_bandwidth: bool = False,
    kv_path: bool = False,
    checks: str | None = None,
) -> None:
    """Check hosts against the profile over SSH: driver, RDMA, KV library, staged weights, units, ports,
    /health, secrets."""
    from pdfleet.checks.kv_path import PROBE_FILE
    from pdfleet.checks.verify import VerifyOptions, print_results, run_verify
    from pdfleet.fleet.roles import role_units

    deployment = open_deployment(
        ctx, profile, inventory, limit=limit, keys="provision", manifests=True, fleet_layout=True
    )
    hosts = deployment.hosts
    lab_site.require_routable(hosts)
    settings = Settings.of(ctx)
    options = VerifyOptions(
        junit=repo_path(junit) if junit else None,
        rdma_bandwidth=rdma_bandwidth,
        kv_path=kv_path,
        kv_probe_source=(settings.templates_dir / PROBE_FILE).read_text() if kv_path else "",
        checks=checks,
        connect_timeout=int(settings.connect_timeout),
        default_known_hosts=settings.known_hosts,
    )

    def units_for(host: Host) -> list[ManagedUnit]:
        """Every unit the profile's roles keep running on the host (vLLM pools, gateway, router)."""
        return role_units(deployment.roles, deployment.context(host))

    run = run_verify(deployment.profile, deployment.topology, hosts, options, units_for, deployment.manifests)
    print_results(run)
    if run.failed or run.exit_code not in (0, 5):
        raise Exit(code=1)

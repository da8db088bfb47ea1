"""`invoke verify`: testinfra checks of every selected host; a host × check table, optional JUnit XML."""

from __future__ import annotations

from typing import TYPE_CHECKING

from invoke import Context, task
from invoke.exceptions import Exit

from pdfleet.cli._common import repo_path, setting, user_errors
from pdfleet.cli.options import HELP, deployment_from_options, require_routable
from pdfleet.errors import PdfleetError
from pdfleet.fleet.roles import role_units
from pdfleet.model.inventory import Host

if TYPE_CHECKING:
    from pdfleet.checks.verify import Unit


@task(
    help={
        "profile": HELP["profile"],
        "inventory": HELP["inventory"],
        "limit": HELP["limit"],
        "junit": "Also write the results as JUnit XML to this path.",
        "rdma_bandwidth": "Also run ib_write_bw between each prefill/decode host pair against "
        "rdma.min_bandwidth_gbps.",
        "checks": "Only checks matching this pytest -k expression (e.g. 'services or kv').",
    }
)
@user_errors
def verify(
    ctx: Context,
    profile: str,
    inventory: str | None = None,
    limit: str | None = None,
    junit: str | None = None,
    rdma_bandwidth: bool = False,
    checks: str | None = None,
) -> None:
    """Check hosts against the profile over SSH: driver, RDMA, KV library, units, ports, /health, secrets."""
    try:  # pytest and testinfra are operator-side tools (the `test` extra), not host dependencies
        from pdfleet.checks.verify import VerifyOptions, managed_unit, print_results, run_verify
    except ImportError as exc:
        raise PdfleetError(
            f"invoke verify needs pytest and pytest-testinfra ({exc}); install them with "
            "`pip install -e '.[test]'`"
        ) from None
    deployment = deployment_from_options(ctx, profile, inventory)
    hosts = list(deployment.inventory.limit(limit).hosts.values())
    require_routable(hosts)
    options = VerifyOptions(
        junit=repo_path(junit) if junit else None,
        rdma_bandwidth=rdma_bandwidth,
        checks=checks,
        connect_timeout=int(setting(ctx, "connect_timeout", 10)),
        default_known_hosts=str(setting(ctx, "known_hosts", "~/.ssh/known_hosts")),
    )

    def units_for(host: Host) -> list[Unit]:
        """Every unit the profile's roles keep running on the host (vLLM pools, gateway, router)."""
        managed = role_units(deployment.roles, deployment.context(host))
        return [managed_unit(m.unit, m.health_url) for m in managed]

    run = run_verify(deployment.profile, deployment.inventory, hosts, options, units_for)
    print_results(run)
    if run.failed or run.exit_code not in (0, 5):
        raise Exit(code=1)

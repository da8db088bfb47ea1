"""TLS check: the gateway's certificate (the file it serves, gateway.tls.cert_file as provision pushed it)
and when it lapses: its notAfter shown per gateway, a warning within the profile's `gateway.tls.warn_days`,
a failure once lapsed. The decision is `certificate_verdict`, pure; the check only reads the file."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from pdfleet.checks.verify import FAIL, PASS, WARN, VerifyPlugin
from pdfleet.fleet.host_layout import GATEWAY_TLS_CERT_FILE
from pdfleet.gateway.tls import pem_not_after
from pdfleet.model.inventory import Host
from pdfleet.model.tls import GatewayTls

DAY_S = 86_400.0


def certificate_verdict(not_after: datetime, now: datetime, warn_days: int) -> tuple[str, str]:
    """(pass | warn | fail, what to show): lapsed fails, within `warn_days` warns, else passes; the
    message gives the notAfter and the days left either way."""
    left = (not_after - now).total_seconds() / DAY_S
    when = not_after.isoformat(timespec="seconds")
    if left <= 0:
        return FAIL, f"the certificate lapsed at {when} ({-left:.1f} days ago): renew it, then provision"
    if left <= warn_days:
        return WARN, (
            f"the certificate lapses at {when}, in {left:.1f} days (gateway.tls.warn_days: {warn_days}): "
            "renew it, then provision (a reload picks it up)"
        )
    return PASS, f"notAfter {when} ({left:.0f} days left)"


def test_gateway_certificate_expiry(
    verify: VerifyPlugin, pd_host: Host, target: Any, record_property: Any
) -> None:
    if verify.topology.gateway_on(pd_host.name) is None:
        pytest.skip("runs no gateway")
    tls = verify.profile.gateway.tls
    if not isinstance(tls, GatewayTls):
        pytest.skip("the gateway speaks plain HTTP (gateway.tls: off): no certificate")
    cert = target.file(GATEWAY_TLS_CERT_FILE)
    assert cert.exists, f"{GATEWAY_TLS_CERT_FILE} is missing: provision installs the gateway's certificate"
    try:
        not_after = pem_not_after(cert.content_string)
    except ValueError:
        pytest.fail(f"{GATEWAY_TLS_CERT_FILE}: not a PEM certificate")
    outcome, message = certificate_verdict(not_after, datetime.now(UTC), tls.warn_days)
    assert outcome != FAIL, message
    record_property(WARN if outcome == WARN else "note", message)  # shown beside the table

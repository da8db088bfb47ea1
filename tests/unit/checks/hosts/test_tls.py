"""`invoke verify`'s certificate check: openssl-made certificates' notAfter read from their PEM text as the
check reads the gateway's file, and the verdict: shown, warned within warn_days, failed once lapsed; a
warning reaches the results and the printed table without failing the run."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from pdfleet.checks.hosts.tls import certificate_verdict
from pdfleet.checks.verify import FAIL, PASS, WARN, CheckResult, VerifyRun, print_results
from pdfleet.gateway.tls import pem_not_after
from pdfleet.lab import pki

pytestmark = pytest.mark.procs  # runs openssl


def _openssl_end(cert: Path) -> datetime:
    """openssl's own reading of the certificate's notAfter."""
    out = subprocess.run(
        ["openssl", "x509", "-noout", "-enddate", "-in", str(cert)],
        capture_output=True,
        text=True,
        check=True,
    )
    return datetime.strptime(out.stdout.strip().removeprefix("notAfter="), "%b %d %H:%M:%S %Y %Z").replace(
        tzinfo=UTC
    )


@pytest.mark.parametrize(("days", "outcome"), [(90, PASS), (10, WARN)])
def test_an_openssl_certificate_is_shown_and_warned_within_warn_days(
    tmp_path: Path, days: int, outcome: str
) -> None:
    ca = pki.make_ca(tmp_path)
    cert = pki.issue(ca, tmp_path, "gateway", ["lab-gw"], ["198.18.0.10"], days=days).cert
    not_after = pem_not_after(cert.read_text())
    assert not_after == _openssl_end(cert)
    now = datetime.now(UTC)
    assert timedelta(days=days - 1) < not_after - now <= timedelta(days=days)
    found, message = certificate_verdict(not_after, now, warn_days=21)
    assert found == outcome and not_after.isoformat(timespec="seconds") in message
    if outcome == WARN:
        assert "in 10.0 days (gateway.tls.warn_days: 21): renew it" in message or "in 9.9 days" in message
    else:
        assert message.startswith("notAfter ") and "days left" in message


def test_a_lapsed_certificate_fails_and_the_bounds_are_exact(tmp_path: Path) -> None:
    ca = pki.make_ca(tmp_path)
    not_after = pem_not_after(pki.issue(ca, tmp_path, "gw", ["lab-gw"], [], days=30).cert.read_text())
    outcome, message = certificate_verdict(not_after, not_after + timedelta(days=2), warn_days=21)
    assert outcome == FAIL and "lapsed at" in message and "(2.0 days ago)" in message
    assert certificate_verdict(not_after, not_after, 21)[0] == FAIL  # at notAfter it no longer verifies
    assert certificate_verdict(not_after, not_after - timedelta(days=21), 21)[0] == WARN
    assert certificate_verdict(not_after, not_after - timedelta(days=21, seconds=1), 21)[0] == PASS


def test_text_that_holds_no_certificate_is_refused(tmp_path: Path) -> None:
    ca = pki.make_ca(tmp_path)
    for text in (
        "",
        "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n",
        ca.key.read_text(),
    ):
        with pytest.raises(ValueError, match="not a PEM certificate"):
            pem_not_after(text)


def test_a_warning_is_printed_with_its_reason_and_does_not_fail_the_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    results = [
        CheckResult(
            "lab-gw", "tls/gateway_certificate_expiry", WARN, "the certificate lapses at X, in 3.0 days"
        ),
        CheckResult("lab-gw2", "tls/gateway_certificate_expiry", PASS, "notAfter Y (300 days left)"),
    ]
    run = VerifyRun(results, 0)
    print_results(run)
    out = " ".join(capsys.readouterr().out.split())  # rich wraps at the terminal's width
    assert "warn lab-gw tls/gateway_certificate_expiry: the certificate lapses at X, in 3.0 days" in out
    assert "pass lab-gw2 tls/gateway_certificate_expiry: notAfter Y (300 days left)" in out
    assert "1 passed, 0 failed, 0 skipped, 1 warned" in out and run.failed == []

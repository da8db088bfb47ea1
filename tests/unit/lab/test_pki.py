"""The lab CA (openssl): a CA, a gateway certificate for the gateway's names and addresses that verifies
against it, made once and again only when the names change."""

from __future__ import annotations

import contextlib
import ssl
from pathlib import Path

import pytest

from pdfleet.errors import PdfleetError
from pdfleet.gateway import tls
from pdfleet.lab import pki

pytestmark = pytest.mark.procs  # openssl


def test_the_gateway_certificate_chains_to_the_ca_for_its_name_and_address(tmp_path: Path) -> None:
    ca, gw, made = pki.ensure_lab_pki(tmp_path, ["lab-gw"], ["198.18.0.10"])
    assert made and ca.key.stat().st_mode & 0o777 == 0o600 and gw.key.stat().st_mode & 0o777 == 0o600
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(gw.cert, gw.key)
    client = ssl.create_default_context(cafile=str(ca.cert))
    for name in ("lab-gw", "198.18.0.10"):
        c, s = ssl.MemoryBIO(), ssl.MemoryBIO()
        cs = client.wrap_bio(c, s, server_hostname=name)
        ss = server.wrap_bio(s, c, server_side=True)
        for _ in range(10):
            for side in (cs, ss):
                with contextlib.suppress(ssl.SSLWantReadError):
                    side.do_handshake()
        assert cs.getpeercert()["subjectAltName"] == (("DNS", "lab-gw"), ("IP Address", "198.18.0.10"))
    days = (
        tls.seconds_left(tls.check(tls.TlsSpec(cert_file=str(gw.cert), key_file=str(gw.key)), tmp_path))
        / 86400
    )
    assert pki.GATEWAY_DAYS - 1 < days <= pki.GATEWAY_DAYS


def test_made_once_and_again_when_the_gateways_change(tmp_path: Path) -> None:
    _, gw, _ = pki.ensure_lab_pki(tmp_path, ["lab-gw"], ["198.18.0.10"])
    first = gw.cert.read_bytes()
    assert pki.ensure_lab_pki(tmp_path, ["lab-gw"], ["198.18.0.10"])[2] is False
    assert gw.cert.read_bytes() == first
    assert pki.ensure_lab_pki(tmp_path, ["lab16-gw"], ["198.18.0.40"])[2] is True
    assert gw.cert.read_bytes() != first


def test_a_certificate_needs_a_name() -> None:
    with pytest.raises(PdfleetError, match="at least one name"):
        pki.issue(
            pki.Pair(Path("/nonexistent/ca.crt"), Path("/nonexistent/ca.key")), Path("/tmp"), "x", [], []
        )


def test_a_renewal_that_fails_leaves_the_pair_there_as_it_was(tmp_path: Path) -> None:
    """The new key and certificate are made aside: a renewal openssl refuses (a CA key that is not the
    CA's) leaves the old key with its own certificate, and no scratch files."""
    ca, gw, _ = pki.ensure_lab_pki(tmp_path, ["lab-gw"], ["198.18.0.10"])
    before = (gw.cert.read_bytes(), gw.key.read_bytes())
    stranger = pki.make_ca(tmp_path / "other")
    with pytest.raises(PdfleetError, match="openssl x509 failed"):
        pki.issue(pki.Pair(ca.cert, stranger.key), tmp_path, "gateway", ["lab-gw"], ["198.18.0.10"])
    assert (gw.cert.read_bytes(), gw.key.read_bytes()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["ca.crt", "ca.key", "gateway.crt", "gateway.key", "gateway.san", "other"]
    )
    renewed = pki.issue(ca, tmp_path, "gateway", ["lab-gw"], ["198.18.0.10"])
    assert renewed.cert.read_bytes() != before[0] and renewed.key.stat().st_mode & 0o777 == 0o600
    tls.check(tls.TlsSpec(cert_file=str(renewed.cert), key_file=str(renewed.key)), tmp_path)  # a pair

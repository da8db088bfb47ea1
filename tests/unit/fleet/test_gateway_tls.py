"""The site's PKI on the control machine: read and checked before provision pushes anything (errors name
the profile key and the file), placeholders for a review."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdfleet.errors import ValidationError
from pdfleet.fleet.gateway_tls import placeholder_material, tls_material
from pdfleet.lab import pki
from pdfleet.model.tls import GatewayTls

pytestmark = pytest.mark.procs  # openssl


def _setting(pair: pki.Pair, ca: pki.Pair) -> GatewayTls:
    return GatewayTls(cert_file=str(pair.cert), key_file=str(pair.key), ca_file=str(ca.cert))


def test_material_is_the_files_and_the_expiry(tmp_path: Path) -> None:
    ca = pki.make_ca(tmp_path)
    pair = pki.issue(ca, tmp_path, "gw", ["gw"], [])
    got = tls_material(_setting(pair, ca))
    assert got is not None and got.key == pair.key.read_text() and got.ca == ca.cert.read_text()
    assert got.expiry is not None and not got.placeholders and "PRIVATE" not in repr(got)
    assert tls_material("off") is None and tls_material(None) is None


def test_a_ca_that_did_not_sign_the_certificate_is_refused(tmp_path: Path) -> None:
    ca, other = pki.make_ca(tmp_path / "a"), pki.make_ca(tmp_path / "b")
    pair = pki.issue(ca, tmp_path, "gw", ["gw"], [])
    with pytest.raises(ValidationError, match=r"gateway\.tls\.ca_file: .*b/ca\.crt: did not issue"):
        tls_material(_setting(pair, other))


def test_a_key_others_can_read_is_refused_naming_the_profile_key(tmp_path: Path) -> None:
    ca = pki.make_ca(tmp_path)
    pair = pki.issue(ca, tmp_path, "gw", ["gw"], [])
    pair.key.chmod(0o644)
    with pytest.raises(ValidationError, match=r"gateway\.tls\.key_file: .*gw\.key.*chmod 600"):
        tls_material(_setting(pair, ca))


def test_missing_files_refuse_a_provision_and_are_placeholders_in_a_review(tmp_path: Path) -> None:
    setting = GatewayTls(
        cert_file="~/nope/gw.crt", key_file="~/nope/gw.key", ca_file=str(tmp_path / "ca.crt")
    )
    with pytest.raises(ValidationError, match=r"gateway\.tls\.cert_file: .*nope/gw\.crt"):
        tls_material(setting)
    review = tls_material(setting, review=True)
    assert review is not None and len(review.placeholders) == 3 and review.expiry is None
    assert review.key.startswith("# placeholder: ~/nope/gw.key does not exist yet")


def test_placeholder_material_reads_no_file_even_where_they_exist(tmp_path: Path) -> None:
    """All three as placeholders (what the fleet unit tests render for the lab's live PKI); with a file
    missing, a review reads the certificate and CA that exist and never the key."""
    ca = pki.make_ca(tmp_path)
    pair = pki.issue(ca, tmp_path, "gw", ["gw"], [])
    setting = _setting(pair, ca)
    got = placeholder_material(setting)
    assert got.cert == f"# placeholder: {pair.cert} does not exist yet; provision refuses to run without it\n"
    assert "PRIVATE" not in got.key and got.ca.startswith("# placeholder:") and got.expiry is None
    assert got.placeholders == (pair.cert, pair.key, ca.cert)
    ca.cert.unlink()
    review = tls_material(setting, review=True)
    assert review is not None and review.placeholders == (ca.cert,) and review.expiry is None
    assert review.cert == pair.cert.read_text() and review.key.startswith("# placeholder:")

"""The profile's gateway.tls: the site's PKI or `off` (a bare YAML `off` too), never unset; plain HTTP is
warned about by `invoke profiles`, HTTPS is not."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdfleet.errors import ValidationError
from pdfleet.model.profile_loader import load_profile
from pdfleet.model.survey import survey_profiles
from pdfleet.model.tls import PLAIN, GatewayTls
from tests.unit.model.helpers import GOOD, write


def _profile(tmp_path: Path, tls: str) -> Path:
    write(tmp_path, GOOD.replace("  tls: off\n", tls), "_good.yml")
    return write(tmp_path, "extends: _good\n", "p.yml")


def test_off_in_any_spelling_is_plain_http_and_warned(tmp_path: Path) -> None:
    for spelling in ("  tls: off\n", '  tls: "off"\n', "  tls: false\n"):
        _profile(tmp_path, spelling)
        assert load_profile("p", tmp_path).gateway.tls == PLAIN
        (status,) = survey_profiles(tmp_path, names=["p"])
        assert status.ok and any(
            "gateway.tls: the gateway listens in plain HTTP" in w for w in status.warnings
        )


def test_the_sites_pki_is_three_files_and_not_warned(tmp_path: Path) -> None:
    _profile(tmp_path, "  tls: {cert_file: /pki/gw.crt, key_file: /pki/gw.key, ca_file: /pki/ca.crt}\n")
    tls = load_profile("p", tmp_path).gateway.tls
    assert isinstance(tls, GatewayTls) and (tls.cert_file, tls.warn_days) == ("/pki/gw.crt", 21)
    (status,) = survey_profiles(tmp_path, names=["p"])
    assert status.ok and not [w for w in status.warnings if "gateway.tls" in w]


@pytest.mark.parametrize(
    ("tls", "says"),
    [
        ("", "gateway.tls"),  # unset: a profile must say which
        ("  tls: on\n", "gateway.tls"),
        ("  tls: {cert_file: /a.crt, key_file: /a.key}\n", "ca_file"),
        ("  tls: {cert_file: /a.crt, key_file: /a.key, ca_file: /c.crt, port: 1}\n", "port"),
    ],
)
def test_anything_else_is_refused_naming_the_key(tmp_path: Path, tls: str, says: str) -> None:
    _profile(tmp_path, tls)
    with pytest.raises(ValidationError, match=says):
        load_profile("p", tmp_path)


def test_every_shipped_profile_says_which() -> None:
    repo = Path(__file__).resolve().parents[3] / "profiles"
    statuses = {s.name: s for s in survey_profiles(repo)}
    plain = sorted(n for n, s in statuses.items() if any("plain HTTP" in w for w in s.warnings))
    assert "lab-cross" not in plain and "cross-rdma" not in plain and "lab-cross-plain" in plain

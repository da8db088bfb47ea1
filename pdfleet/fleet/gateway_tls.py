"""The gateway's TLS on the control machine: the site's PKI files the profile names (`gateway.tls`),
read and checked before anything is pushed, and the client side every caller of the gateway uses.

`tls_material` reads the certificate, key and CA (provision: a missing or bad file is an error naming it
and the profile key; render, a review: a missing file stands as a placeholder). The pair is checked as
the gateway will load it (pdfleet.gateway.tls: PEM, the key 0600 and the certificate's own), the CA as a
PEM certificate the certificate chains to (the gateway's name is not checked here: the controller and
health probes check it against the host's address on every call). The client side (what the
controller, bench, doctor, monitor, shadow and verify hand their HTTP clients: verification on, the CA
the topology names, pdfleet.fleet.topology.Gateway.ca_file) is pdfleet.gateway.tls.client_context.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from pdfleet.errors import ValidationError
from pdfleet.gateway import tls
from pdfleet.gateway.policy_spec import TlsSpec
from pdfleet.model.tls import GatewayTls, GatewayTlsSetting

PLACEHOLDER = "# placeholder: {path} does not exist yet; provision refuses to run without it\n"
WHERE = "gateway.tls"


@dataclass(frozen=True)
class TlsMaterial:
    """The PEM texts provision pushes, and the certificate's expiry (None: placeholders, render only)."""

    cert: str
    key: str = field(repr=False)
    ca: str
    expiry: datetime | None
    placeholders: tuple[Path, ...] = ()


def _paths(spec: GatewayTls) -> tuple[Path, Path, Path]:
    return (
        Path(spec.cert_file).expanduser(),
        Path(spec.key_file).expanduser(),
        Path(spec.ca_file).expanduser(),
    )


def _check_ca(ca: Path, cert: Path) -> str:
    """The CA's PEM text, refused unless it is a PEM certificate that issued `cert`."""
    head = f"profile: {WHERE}.ca_file: {ca}"
    try:
        raw = ca.read_bytes()
        authority = x509.load_pem_x509_certificate(raw)
        leaf = x509.load_pem_x509_certificate(cert.read_bytes())
    except OSError as exc:
        raise ValidationError(f"{head}: cannot read the CA certificate: {exc.strerror}") from None
    except ValueError:
        raise ValidationError(f"{head}: not a PEM certificate (-----BEGIN CERTIFICATE-----)") from None
    try:
        leaf.verify_directly_issued_by(authority)
    except (ValueError, TypeError, InvalidSignature):
        raise ValidationError(
            f"{head}: did not issue {cert} (its issuer is {leaf.issuer.rfc4514_string()}); "
            "name the CA that signed the gateway's certificate"
        ) from None
    return raw.decode("ascii", "replace")


def placeholder_material(setting: GatewayTls, missing: tuple[Path, ...] | None = None) -> TlsMaterial:
    """What a review renders: the files in `missing` (None: all three, none read) as placeholders, the
    certificate and CA read otherwise, the key never. A placeholder names its file as the profile does
    (no one's home in it)."""
    paths = _paths(setting)
    missing = paths if missing is None else missing
    cert, key, ca = paths
    written = dict(zip(paths, (setting.cert_file, setting.key_file, setting.ca_file), strict=True))
    text = {p: PLACEHOLDER.format(path=written[p]) for p in missing}
    read = {p: text.get(p) or p.read_text(encoding="ascii", errors="replace") for p in (cert, ca)}
    return TlsMaterial(read[cert], PLACEHOLDER.format(path=written[key]), read[ca], None, missing)


def tls_material(setting: GatewayTlsSetting | None, review: bool = False) -> TlsMaterial | None:
    """The files' texts (None: plain HTTP). `review`: missing files stand as placeholders."""
    if setting is None or isinstance(setting, str):
        return None
    cert, key, ca = _paths(setting)
    missing = tuple(p for p in (cert, key, ca) if not p.exists())
    if missing and review:
        return placeholder_material(setting, missing)
    spec = TlsSpec(cert_file=str(cert), key_file=str(key))
    expiry = tls.check(spec, Path.cwd(), "profile", WHERE)
    authority = _check_ca(ca, cert)
    key_text = key.read_text(encoding="ascii", errors="replace")
    return TlsMaterial(cert.read_text(encoding="ascii", errors="replace"), key_text, authority, expiry)

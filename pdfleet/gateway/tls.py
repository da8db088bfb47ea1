"""TLS on the gateway's listeners (the policy's `listen.tls`): one server context for the client and admin
ports, built from the site's certificate and key files, renewed in place by a reload.

Settings: Python's server defaults (`ssl.create_default_context(Purpose.CLIENT_AUTH)`: forward-secret
AEAD/CHACHA20 suites only at OpenSSL security level 2, no SHA-1, RC4, 3DES or NULL suites, no TLS
compression) plus `minimum_version = TLSv1_2` set explicitly, no renegotiation, and ALPN `http/1.1`
(the gateway speaks HTTP/1.1 only). The key file must be a regular file readable by its owner only
(0600); an encrypted key is refused (the gateway cannot prompt). Errors name the policy key and the
file, never the files' content.

A renewed certificate is loaded into the live context (`renew`): handshakes after it present the new
one, connections already open keep theirs, so no stream in flight is dropped. The new pair is loaded
into a throwaway context first: a bad pair leaves the live one untouched.
"""

from __future__ import annotations

import ssl
from datetime import UTC, datetime
from pathlib import Path

from pdfleet.errors import ValidationError
from pdfleet.gateway.keys import check_secret_file_mode
from pdfleet.gateway.policy_spec import TlsSpec

MINIMUM_VERSION = ssl.TLSVersion.TLSv1_2
ALPN = ("http/1.1",)


def tls_paths(spec: TlsSpec, base: Path) -> tuple[Path, Path]:
    """The certificate and key files, a relative path taken from `base` (the policy file's directory)."""
    cert, key = Path(spec.cert_file), Path(spec.key_file)
    return (cert if cert.is_absolute() else base / cert), (key if key.is_absolute() else base / key)


def _new_context() -> ssl.SSLContext:
    """A server context with the settings of the module docstring and no certificate yet."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = MINIMUM_VERSION
    ctx.options |= ssl.OP_NO_RENEGOTIATION
    ctx.set_alpn_protocols(list(ALPN))
    return ctx


def _no_password() -> bytes:
    raise ValidationError("encrypted")


def _der_items(data: bytes) -> list[tuple[int, bytes]]:
    """The (tag, content) of each DER element in `data` (ValueError on a malformed length)."""
    items, i = [], 0
    while i < len(data):
        tag, length = data[i], data[i + 1]
        i += 2
        if length & 0x80:
            count = length & 0x7F
            if not 0 < count <= 4:
                raise ValueError("bad DER length")
            length, i = int.from_bytes(data[i : i + count], "big"), i + count
        if i + length > len(data):
            raise ValueError("truncated DER")
        items.append((tag, data[i : i + length]))
        i += length
    return items


def not_after(der: bytes) -> datetime:
    """A DER certificate's notAfter (UTC): Certificate > tbsCertificate > validity (after the optional
    [0] version, the serial, the signature algorithm and the issuer) > its second Time."""
    (_, cert), *_ = _der_items(der)
    tbs = _der_items(_der_items(cert)[0][1])
    fields = tbs[1:] if tbs[0][0] == 0xA0 else tbs
    (_, _), (tag, value) = _der_items(fields[3][1])
    text = value.decode("ascii")
    fmt = "%y%m%d%H%M%SZ" if tag == 0x17 else "%Y%m%d%H%M%SZ"  # UTCTime, else GeneralizedTime
    return datetime.strptime(text, fmt).replace(tzinfo=UTC)


def _read_cert(cert: Path, head: str) -> datetime:
    """The expiry of the first certificate of a PEM file; ValidationError naming the file otherwise."""
    try:
        text = cert.read_text(encoding="ascii", errors="replace")
    except OSError as exc:
        raise ValidationError(f"{head}: cannot read the certificate: {exc.strerror}") from None
    try:
        return pem_not_after(text)
    except ValueError:
        raise ValidationError(f"{head}: not a PEM certificate ({BEGIN})") from None


BEGIN, END = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"


def pem_not_after(text: str) -> datetime:
    """The notAfter (UTC) of the first certificate in PEM text; ValueError when there is none."""
    try:
        start = text.index(BEGIN)
        der = ssl.PEM_cert_to_DER_cert(text[start : text.index(END, start) + len(END)])
        ssl.create_default_context(cadata=der)  # OpenSSL parses it: a real X.509 certificate
        return not_after(der)
    except (ValueError, ssl.SSLError, IndexError, UnicodeDecodeError):
        raise ValueError("not a PEM certificate") from None


def _load(ctx: ssl.SSLContext, spec: TlsSpec, base: Path, source: str, field: str = "listen.tls") -> datetime:
    """Load the pair into `ctx` after checking both files; the certificate's expiry. Errors name
    `source`, the key (`field`.cert_file / .key_file) and the file."""
    cert, key = tls_paths(spec, base)
    cert_head, key_head = f"{source}: {field}.cert_file: {cert}", f"{source}: {field}.key_file: {key}"
    expiry = _read_cert(cert, cert_head)
    check_secret_file_mode(key, "the TLS private key", f"{source}: {field}.key_file")
    try:
        ctx.load_cert_chain(cert, key, password=_no_password)
    except ValidationError:
        raise ValidationError(
            f"{key_head}: the key is encrypted; the gateway needs an unencrypted key (mode 0600)"
        ) from None
    except ssl.SSLError as exc:
        why = exc.reason or "not a PEM private key"
        raise ValidationError(
            f"{key_head}: not the private key of {cert} ({why}); give the certificate's own PEM key"
        ) from None
    except OSError as exc:
        raise ValidationError(f"{key_head}: cannot read the key: {exc.strerror}") from None
    return expiry


def server_context(spec: TlsSpec, base: Path, source: str = "policy") -> ssl.SSLContext:
    """A new server context holding the pair (ValidationError naming the file on any problem)."""
    ctx = _new_context()
    _load(ctx, spec, base, source)
    return ctx


def check(spec: TlsSpec, base: Path, source: str = "policy", field: str = "listen.tls") -> datetime:
    """Check the pair loads (as `server_context` would); the certificate's expiry (UTC)."""
    return _load(_new_context(), spec, base, source, field)


def renew(live: ssl.SSLContext, spec: TlsSpec, base: Path, source: str = "policy") -> datetime:
    """Load the pair the files hold now into the live context (new handshakes present it); the files are
    checked in a throwaway context first, so a bad pair changes nothing. The certificate's expiry."""
    expiry = check(spec, base, source)
    _load(live, spec, base, source)
    return expiry


def seconds_left(expiry: datetime, now: datetime | None = None) -> float:
    """Seconds until `expiry` (negative: lapsed)."""
    return (expiry - (now or datetime.now(UTC))).total_seconds()


def client_context(ca_file: str | None) -> ssl.SSLContext | None:
    """What a client of a TLS gateway verifies with: certificate and name checked against `ca_file`, TLS
    1.2 or later (None: plain HTTP, no TLS at all). ValidationError naming the file when it will not load."""
    if ca_file is None:
        return None
    try:
        ctx = ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not a PEM certificate"
        raise ValidationError(
            f"{ca_file}: cannot load the gateway's CA (gateway.tls.ca_file): {reason}"
        ) from None
    ctx.minimum_version = MINIMUM_VERSION
    return ctx

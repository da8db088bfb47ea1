"""The lab's certificate authority: a CA and the lab gateway's certificate, made with the openssl CLI.

`ensure_lab_pki` (called by `invoke lab.up`) creates, once, under the lab's state root: `tls/ca.crt` and
`tls/ca.key` (P-256, ten years), and `tls/gateway.crt` / `tls/gateway.key` for the lab gateway's name
and address (subjectAltName DNS and IP, serverAuth, `GATEWAY_DAYS`). Keys are 0600, certificates 0644.
TLS lab profiles name these files as their site PKI; `invoke lab.env` points the SDKs at `ca.crt`.
`issue` is also how a test renews a certificate (same key type, a new serial and validity).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pdfleet.errors import PdfleetError

CA_DAYS = 3650
GATEWAY_DAYS = 365
CURVE = "prime256v1"


@dataclass(frozen=True)
class Pair:
    """A certificate and its private key on disk."""

    cert: Path
    key: Path


def _openssl(*args: str) -> None:
    """Run openssl; PdfleetError with its message (never key material: openssl prints none) on failure."""
    try:
        proc = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False, timeout=60)
    except FileNotFoundError:
        raise PdfleetError(
            "openssl is not installed; the lab CA needs it (apt-get install openssl)"
        ) from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        raise PdfleetError(f"openssl {args[0]} failed: {last}")


def _new_key(path: Path) -> None:
    """A new P-256 private key at `path`, created 0600 (never readable by others, not even briefly)."""
    path.unlink(missing_ok=True)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", f"ec_paramgen_curve:{CURVE}", "-out", str(path))


def make_ca(directory: Path, name: str = "pdfleet lab CA", days: int = CA_DAYS) -> Pair:
    """A self-signed CA (basicConstraints CA:TRUE, keyCertSign) in `directory`: ca.crt and ca.key."""
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    pair = Pair(directory / "ca.crt", directory / "ca.key")
    _new_key(pair.key)
    _openssl(
        "req", "-x509", "-new", "-key", str(pair.key), "-out", str(pair.cert), "-days", str(days),
        "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    pair.cert.chmod(0o644)
    return pair


def san(names: list[str], addresses: list[str]) -> str:
    """The subjectAltName value for DNS names and IP addresses."""
    return ",".join([f"DNS:{n}" for n in names] + [f"IP:{a}" for a in addresses])


def issue(
    ca: Pair, directory: Path, stem: str, names: list[str], addresses: list[str], days: int = GATEWAY_DAYS
) -> Pair:
    """A server certificate signed by `ca` for `names` and `addresses`: {stem}.crt and {stem}.key (0600),
    replacing any there (a renewal: new key, serial and validity).

    Both are made aside in `directory` and renamed into place, key then certificate, so a reader never
    finds a file half written, and a pair that does not match only for the instant between the renames
    (not for the seconds openssl takes)."""
    if not names and not addresses:
        raise PdfleetError("a server certificate needs at least one name or address")
    pair = Pair(directory / f"{stem}.crt", directory / f"{stem}.key")
    ext = (
        f"subjectAltName={san(names, addresses)}\nbasicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
    )
    with tempfile.TemporaryDirectory(dir=directory, prefix=f".{stem}-") as tmp:
        new = Pair(Path(tmp) / "new.crt", Path(tmp) / "new.key")
        csr, extfile = Path(tmp) / "req.csr", Path(tmp) / "ext.cnf"
        _new_key(new.key)
        extfile.write_text(ext)
        cn = (names or addresses)[0]
        _openssl("req", "-new", "-key", str(new.key), "-subj", f"/CN={cn}", "-out", str(csr))
        _openssl(
            "x509", "-req", "-in", str(csr), "-CA", str(ca.cert), "-CAkey", str(ca.key),
            "-set_serial", str(int.from_bytes(os.urandom(8), "big")), "-days", str(days),
            "-extfile", str(extfile), "-out", str(new.cert),
        )  # fmt: skip
        new.cert.chmod(0o644)
        os.replace(new.key, pair.key)
        os.replace(new.cert, pair.cert)
    return pair


def ensure_lab_pki(directory: Path, names: list[str], addresses: list[str]) -> tuple[Pair, Pair, bool]:
    """The lab CA and gateway certificate, made when missing, the certificate again when the gateways'
    names or addresses changed (another lab inventory); kept as they are otherwise. Whether it made any."""
    ca = Pair(directory / "ca.crt", directory / "ca.key")
    new_ca = not (ca.cert.exists() and ca.key.exists())
    if new_ca:
        ca = make_ca(directory)
    gateway = Pair(directory / "gateway.crt", directory / "gateway.key")
    names_file, wanted = directory / "gateway.san", san(names, addresses) + "\n"
    current = names_file.read_text() if names_file.exists() else ""
    made = new_ca or current != wanted or not (gateway.cert.exists() and gateway.key.exists())
    if made:
        gateway = issue(ca, directory, "gateway", names, addresses)
        names_file.write_text(wanted)
    return ca, gateway, made

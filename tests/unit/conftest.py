"""Fixtures shared by every tests/unit package: an OpenSSH sshd on 127.0.0.1 for `@pytest.mark.sshd` tests
(own host key, own config, own key pair), used by the ops SSH tests and the `invoke verify` tests."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pdfleet.bench.procs import free_port, wait_port
from tests.unit.helpers import Sshd

SSHD = "/usr/sbin/sshd"


def _ensure_sshd() -> str | None:
    """None when sshd is usable, else the reason to skip."""
    if os.geteuid() != 0:
        return "sshd tests need root (sshd must switch users and read its host key)"
    if not Path(SSHD).exists() and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(
            ["apt-get", "install", "-y", "-q", "openssh-server"],
            env=env,
            capture_output=True,
            timeout=600,
            check=False,
        )
    if not Path(SSHD).exists():
        return f"{SSHD} not found and `apt-get install -y openssh-server` did not provide it"
    return None


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """Run `sshd -D -e -f CONFIG` on a free loopback port for the whole session."""
    reason = _ensure_sshd()
    if reason:
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("sshd")
    host_key, client_key = work / "host_ed25519", work / "client_ed25519"
    for key in (host_key, client_key):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    (work / "authorized_keys").write_text(client_key.with_suffix(".pub").read_text())
    port = free_port()
    config = work / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {host_key}\nPidFile {work}/sshd.pid\n"
        f"AuthorizedKeysFile {work}/authorized_keys\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
        "Subsystem sftp internal-sftp\nLogLevel ERROR\nMaxStartups 100\n"
    )
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege-separation directory
    log = (work / "sshd.log").open("wb")
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_port(port, timeout=10.0, proc=proc)
        host_pub = host_key.with_suffix(".pub")
        known = work / "known_hosts"
        keytype, blob = host_pub.read_text().split()[:2]
        known.write_text(f"[127.0.0.1]:{port} {keytype} {blob}\n")
        yield Sshd(port, client_key, known, host_pub, work)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()

"""TLS on the gateway's listeners: the settings, the checks of the certificate and key files (errors name
the file), streams over HTTPS with a CA the client trusts (and refused without it), a renewed certificate
picked up by a reload while a stream is in flight, and hostile bytes on the TLS port."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from pdfleet.gateway import tls
from pdfleet.gateway.policy import load_policy, restart_only_changes
from pdfleet.gateway.policy_spec import TlsSpec
from pdfleet.lab import pki
from tests.unit.gateway.helpers import (
    COLO,
    DIS,
    Env,
    LogCapture,
    chat,
    policy_dict,
    policy_error,
    run,
    sse_events,
    write_policy,
)

pytestmark = pytest.mark.procs  # openssl makes the CA and certificates


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> pki.Pair:
    return pki.make_ca(tmp_path_factory.mktemp("ca"))


def _pair(ca: pki.Pair, directory: Path) -> pki.Pair:
    return pki.issue(ca, directory, "gateway", ["localhost"], ["127.0.0.1"])


def _listen(pair: pki.Pair) -> dict[str, Any]:
    return {"host": "127.0.0.1", "port": 0, "tls": {"cert_file": str(pair.cert), "key_file": str(pair.key)}}


def _client(ca: pki.Pair | None) -> ssl.SSLContext:
    """What an SDK does: verify the server against the CA (None: the system's trust, which lacks it)."""
    return ssl.create_default_context(cafile=str(ca.cert) if ca else None)


def _serial(port: int, ca: pki.Pair) -> int:
    """The serial number of the certificate a new connection is presented."""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        _client(ca).wrap_socket(raw, server_hostname="127.0.0.1") as conn,
    ):
        return int(conn.getpeercert()["serialNumber"], 16)  # type: ignore[index]


# ---- settings ------------------------------------------------------------------------------------


def test_settings_are_tls12_plus_forward_secret_and_http11(ca: pki.Pair, tmp_path: Path) -> None:
    pair = _pair(ca, tmp_path)
    ctx = tls.server_context(TlsSpec(cert_file=str(pair.cert), key_file=str(pair.key)), tmp_path)
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    assert ctx.options & ssl.OP_NO_COMPRESSION and ctx.options & ssl.OP_NO_RENEGOTIATION
    ciphers = ctx.get_ciphers()
    assert ciphers
    for c in ciphers:
        assert c["protocol"] in ("TLSv1.2", "TLSv1.3"), c["name"]
        assert not any(weak in c["name"] for weak in ("RC4", "DES", "NULL", "MD5", "EXP", "PSK")), c["name"]
        assert c["digest"] not in ("sha1", "md5"), c["name"]
        if c["protocol"] == "TLSv1.2":  # forward secrecy: every 1.2 suite is (EC)DHE
            assert c["kea"] in ("kx-ecdhe", "kx-dhe"), c["name"]


def test_relative_paths_are_from_the_policy_directory(ca: pki.Pair, tmp_path: Path) -> None:
    _pair(ca, tmp_path)
    policy = load_policy(
        write_policy(
            tmp_path,
            policy_dict(
                COLO, DIS, listen={"port": 0, "tls": {"cert_file": "gateway.crt", "key_file": "gateway.key"}}
            ),
        )
    )
    assert policy.tls_expiry is not None and tls.seconds_left(policy.tls_expiry) > 300 * 86400


# ---- bad files: clear errors naming the file -----------------------------------------------------


def _tls_error(tmp_path: Path, cert: Path, key: Path) -> str:
    listen = {"port": 0, "tls": {"cert_file": str(cert), "key_file": str(key)}}
    return policy_error(tmp_path, policy_dict(COLO, DIS, listen=listen))


def test_missing_certificate_names_the_file(ca: pki.Pair, tmp_path: Path) -> None:
    pair = _pair(ca, tmp_path)
    msg = _tls_error(tmp_path, tmp_path / "nope.crt", pair.key)
    assert "listen.tls.cert_file" in msg and "nope.crt" in msg and "No such file" in msg


def test_key_readable_by_others_is_refused(ca: pki.Pair, tmp_path: Path) -> None:
    pair = _pair(ca, tmp_path)
    pair.key.chmod(0o644)
    msg = _tls_error(tmp_path, pair.cert, pair.key)
    assert "listen.tls.key_file" in msg and str(pair.key) in msg and "chmod 600" in msg


def test_key_of_another_certificate_is_refused(ca: pki.Pair, tmp_path: Path) -> None:
    pair = _pair(ca, tmp_path)
    other = pki.issue(ca, tmp_path, "other", ["localhost"], [])
    msg = _tls_error(tmp_path, pair.cert, other.key)
    assert "listen.tls.key_file" in msg and str(other.key) in msg and "not the private key of" in msg


@pytest.mark.parametrize("content", [b"", b"hello\n", b"\x00\xff" * 40, b"-----BEGIN CERTIFICATE-----\nzz\n"])
def test_certificate_that_is_not_pem_is_refused(ca: pki.Pair, tmp_path: Path, content: bytes) -> None:
    pair = _pair(ca, tmp_path)
    bad = tmp_path / "bad.crt"
    bad.write_bytes(content)
    msg = _tls_error(tmp_path, bad, pair.key)
    assert "listen.tls.cert_file" in msg and "bad.crt" in msg and "not a PEM certificate" in msg


def test_hostile_key_content_is_refused_without_echo(ca: pki.Pair, tmp_path: Path) -> None:
    pair = _pair(ca, tmp_path)
    pair.key.write_text("-----BEGIN PRIVATE KEY-----\nsecret-looking-bytes\n-----END PRIVATE KEY-----\n")
    msg = _tls_error(tmp_path, pair.cert, pair.key)
    assert "listen.tls.key_file" in msg and "secret-looking-bytes" not in msg


def test_encrypted_key_is_refused_without_a_prompt(ca: pki.Pair, tmp_path: Path) -> None:
    pair = _pair(ca, tmp_path)
    enc = tmp_path / "enc.key"
    subprocess.run(
        ["openssl", "pkey", "-in", str(pair.key), "-aes256", "-passout", "pass:pw", "-out", str(enc)],
        check=True,
    )
    enc.chmod(0o600)
    msg = _tls_error(tmp_path, pair.cert, enc)
    assert "enc.key" in msg and "encrypted" in msg


def test_turning_tls_on_needs_a_restart(ca: pki.Pair, tmp_path: Path) -> None:
    pair = _pair(ca, tmp_path)
    plain = load_policy(write_policy(tmp_path, policy_dict(COLO, DIS)))
    on = load_policy(write_policy(tmp_path, policy_dict(COLO, DIS, listen=_listen(pair))))
    assert any("listen.tls turned on" in p for p in restart_only_changes(plain.spec, on.spec))
    assert restart_only_changes(on.spec, on.spec) == []


# ---- over the wire -------------------------------------------------------------------------------


async def _trusting(env: Env, ca: pki.Pair | None) -> None:
    """Give the test's session the client's trust (the CA, or none of it)."""
    await env.session.close()
    env.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=_client(ca)))


def test_stream_over_tls_with_the_ca_and_refused_without(ca: pki.Pair, tmp_path: Path) -> None:
    pair = _pair(ca, tmp_path)

    async def scenario() -> None:
        async with Env(tmp_path, listen=_listen(pair)) as env:
            assert env.base.startswith("https://")
            await _trusting(env, ca)
            status, _, body = await env.post("/v1/chat/completions", chat(stream=True))
            assert status == 200 and sse_events(body)[-1] == "[DONE]"
            async with env.session.get(env.base + "/metrics") as r:
                text = await r.text()
            assert "pdfleet_gateway_tls_certificate_expiry_timestamp_seconds 1." in text
            await _trusting(env, None)
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await env.post("/v1/chat/completions", chat())
            plain = "http://" + env.base.removeprefix("https://")
            with pytest.raises(aiohttp.ClientError):  # plain HTTP to the TLS port: no answer
                async with env.session.get(plain + "/health") as r:
                    await r.read()

    run(scenario())


def test_reload_presents_a_renewed_certificate_while_a_stream_finishes(ca: pki.Pair, tmp_path: Path) -> None:
    pair = _pair(ca, tmp_path)

    async def scenario() -> None:
        async with Env(tmp_path, delay=0.05, listen=_listen(pair)) as env:
            await _trusting(env, ca)
            assert env.gw is not None
            port = env.gw.port
            before = await asyncio.to_thread(_serial, port, ca)
            stream = asyncio.create_task(env.post("/v1/chat/completions", chat(stream=True)))
            await asyncio.sleep(0.1)  # the stream is going
            await asyncio.to_thread(_pair, ca, tmp_path)  # the site renews: new key, serial, validity
            ok, msg = await env.gw.gateway.reload()
            assert ok, msg
            after = await asyncio.to_thread(_serial, port, ca)
            assert after != before
            status, _, body = await stream
            assert status == 200 and sse_events(body)[-1] == "[DONE]"

    run(scenario())


def test_a_bad_renewal_is_rejected_and_the_old_certificate_stays(ca: pki.Pair, tmp_path: Path) -> None:
    pair = _pair(ca, tmp_path)

    async def scenario() -> None:
        async with Env(tmp_path, listen=_listen(pair)) as env:
            assert env.gw is not None
            before = await asyncio.to_thread(_serial, env.gw.port, ca)
            pair.key.chmod(0o640)
            ok, msg = await env.gw.gateway.reload()
            assert not ok and "listen.tls.key_file" in msg and "chmod 600" in msg
            assert await asyncio.to_thread(_serial, env.gw.port, ca) == before

    run(scenario())


def test_plain_http_and_garbage_on_the_tls_port_leave_no_traceback(ca: pki.Pair, tmp_path: Path) -> None:
    pair = _pair(ca, tmp_path)

    async def scenario() -> None:
        async with Env(tmp_path, listen=_listen(pair)) as env:
            assert env.gw is not None
            for data in (
                b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
                b"\x16\x03\x01\x00\x05hello",
                b"\x00" * 4096,
            ):
                reader, writer = await asyncio.open_connection("127.0.0.1", env.gw.port)
                writer.write(data)
                await writer.drain()
                got = await asyncio.wait_for(reader.read(), 5)
                assert b"HTTP/1.1 200" not in got
                writer.close()
            await _trusting(env, ca)
            async with env.session.get(env.base + "/health") as r:
                assert r.status == 200

    with LogCapture() as logs:
        run(scenario())
    assert "Traceback" not in logs.text
    assert not [r for r in logs.records if r.levelno >= logging.ERROR]


def test_check_prints_the_certificates_expiry_and_names_a_bad_key(
    ca: pki.Pair, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pdfleet.gateway.cli import main

    pair = _pair(ca, tmp_path)
    path = write_policy(tmp_path, policy_dict(COLO, DIS, listen=_listen(pair)))
    assert main(["--config", str(path), "--check"]) == 0
    assert "TLS certificate valid until 20" in capsys.readouterr().out
    pair.key.chmod(0o604)
    assert main(["--config", str(path), "--check"]) == 2
    err = capsys.readouterr().err
    assert "listen.tls.key_file" in err and "Traceback" not in err

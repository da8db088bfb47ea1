"""The gateway's client side of HTTP: protocol errors as OpenAI errors that quote nothing (no key in a
body or a log line, one rate-limited line each), the head, body and idle deadlines, the per-address
connection cap; and hypothesis-generated raw requests over a real socket."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import http_exceptions as hx
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pdfleet.gateway.server import LogLimiter, describe_protocol_error
from tests.unit.gateway.helpers import (
    ADMIN_KEY,
    USER_KEY,
    Env,
    LogCapture,
    LoopThread,
    assert_no_key,
    chat,
    error_of,
    raw_exchange,
    run,
)

GOOD = json.dumps(chat()).encode()


def _request(auth_line: bytes, path: bytes = b"/v1/chat/completions", body: bytes = GOOD) -> bytes:
    """A POST whose Authorization line is exactly `auth_line` (CRLF added)."""
    return (
        b"POST %s HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n%s\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (path, auth_line, len(body), body)
    )


# ---- pure parts --------------------------------------------------------------------------------


def test_protocol_error_descriptions_name_the_problem_and_quote_nothing() -> None:
    secret = "sk-secret-abcdef"
    cases = [
        (hx.LineTooLong(f"Bearer {secret}" * 10, "8190"), "longer than"),
        (
            hx.BadHttpMessage(f"Invalid header value char:\n\n  b'Authorization: Bearer {secret}'\n ^"),
            "header",
        ),
        (hx.BadStatusLine(f"GET /{secret}"), "request line"),
        (hx.InvalidHeader(f"Authorization: {secret}"), "header line"),
        (ValueError(secret), "not valid HTTP"),
        (None, "not valid HTTP"),
    ]
    for exc, fragment in cases:
        text = describe_protocol_error(exc)
        assert fragment in text and secret not in text and "sk-" not in text
    llhttp = hx.BadHttpMessage("Invalid header value char:\n\n  b'x'\n ^")
    assert "(parser: Invalid header value char)" in describe_protocol_error(llhttp)


def test_log_limiter_lets_a_burst_through_then_counts_what_it_dropped() -> None:
    now = [0.0]
    limiter = LogLimiter(burst=3, window_s=10, clock=lambda: now[0])
    assert [limiter.admit() for _ in range(5)] == [0, 0, 0, None, None]
    now[0] = 10.0
    assert limiter.admit() == 2  # the first line of the next window says two were dropped
    assert limiter.admit() == 0


# ---- D1, D8: protocol errors ---------------------------------------------------------------------

AUTH_VARIANTS = [  # (id, Authorization line given the key): every one is a request aiohttp cannot parse
    ("trailing-0x01", lambda k: b"Authorization: Bearer " + k + b"\x01"),
    ("trailing-nul", lambda k: b"Authorization: Bearer " + k + b"\x00"),
    ("bare-cr", lambda k: b"Authorization: Bearer " + k + b"\rX-After: 1"),
    ("bare-lf", lambda k: b"Authorization: Bearer " + k + b"\nX-After: 1"),
    ("obs-fold", lambda k: b"Authorization: Bearer\r\n " + k),
    ("space-before-colon", lambda k: b"Authorization : Bearer " + k),
    ("over-8190-bytes", lambda k: b"Authorization: Bearer " + k + b"x" * 8200),
    ("key-in-header-name", lambda k: b"Bearer " + k + b" : 1"),
]
KEYS = [("user", USER_KEY, b"/v1/chat/completions"), ("admin", ADMIN_KEY, b"/admin/policy")]


@pytest.mark.parametrize("key", KEYS, ids=[k[0] for k in KEYS])
@pytest.mark.parametrize("variant", AUTH_VARIANTS, ids=[v[0] for v in AUTH_VARIANTS])
def test_malformed_authorization_lines_echo_no_key(tmp_path: Path, variant, key) -> None:  # type: ignore[no-untyped-def]
    _, line = variant
    _, secret, path = key
    raw = _request(line(secret.encode()), path)

    async def scenario() -> None:
        async with Env(tmp_path) as env:
            with LogCapture() as logs:
                status, body = await asyncio.to_thread(raw_exchange, env.gw.port, raw)  # type: ignore[union-attr]
                await asyncio.sleep(0.05)
            assert status == 400, body
            err = error_of(body)
            assert err["type"] == "invalid_request_error" and err["code"] == "invalid_http_request"
            assert "malformed HTTP request" in err["message"]
            assert_no_key(body, logs.text)
            assert "Traceback" not in logs.text
            protocol_lines = [r for r in logs.records if "protocol error" in r.getMessage()]
            assert len(protocol_lines) == 1 and protocol_lines[0].levelname == "WARNING"
            assert not env.colo.seen and not env.dis.seen
            assert await env.metric("pdfleet_gateway_requests_total", status="400") == 1

    run(scenario())


def test_protocol_error_lines_are_rate_limited(tmp_path: Path) -> None:
    raw = _request(b"Authorization: Bearer " + USER_KEY.encode() + b"\x01")

    async def scenario() -> None:
        async with Env(tmp_path) as env:
            # one window however long the 40 exchanges take (seconds, when the unit phase runs niced
            # beside the lab): a second window would let a second burst through
            for runner in env.gw.runners:  # type: ignore[union-attr]
                runner.server.log_limiter.clock = lambda: 0.0  # type: ignore[union-attr]
            with LogCapture() as logs:
                for _ in range(40):
                    status, body = await asyncio.to_thread(raw_exchange, env.gw.port, raw)  # type: ignore[union-attr]
                    assert status == 400 and error_of(body)["code"] == "invalid_http_request"
            lines = [r for r in logs.records if r.name.startswith(("pdfleet", "aiohttp"))]
            assert 1 <= len(lines) <= 5, [r.getMessage() for r in lines]  # 40 errors within one window
            assert await env.metric("pdfleet_gateway_requests_total", status="400") == 40

    run(scenario())


def test_a_broken_chunked_body_is_a_protocol_error_that_quotes_nothing(tmp_path: Path) -> None:
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" % USER_KEY.encode()
    )

    async def scenario() -> None:
        async with Env(tmp_path) as env:
            for chunks in (b'5\r\n{"mod\r\nzz\r\n', b"zz" + USER_KEY.encode() + b"\r\n"):
                status, body = await asyncio.to_thread(raw_exchange, env.gw.port, head + chunks)
                assert status == 400, body
                err = error_of(body)
                assert err["code"] == "invalid_http_request" and "chunked body framing" in err["message"]
                assert_no_key(body)
            assert not env.colo.seen and not env.dis.seen

    run(scenario())


# ---- D6: client deadlines and the connection cap ------------------------------------------------


async def _read_all(reader: asyncio.StreamReader, within: float) -> bytes:
    """Everything the gateway sends until it closes the connection (fails if it has not after `within` s)."""
    return await asyncio.wait_for(reader.read(), within)


# How long a deadline under test may take to act: the unit phase runs niced beside the lab, where this
# process can be starved for seconds, so this is far above the sub-second deadlines the tests set, and
# still far below the defaults a deadline not applied would leave (idle 75 s) and below the slow head's
# drip, which never ends
PATIENT_S = 20


def test_an_idle_connection_is_closed_after_the_idle_timeout(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Env(tmp_path, clients={"idle_timeout_s": 0.3}) as env:
            port = env.gw.port  # type: ignore[union-attr]
            reader, writer = await asyncio.open_connection("127.0.0.1", port)  # never sends a byte
            assert await _read_all(reader, PATIENT_S) == b""
            writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)  # one request, then idle
            writer.write(b"GET /health HTTP/1.1\r\nHost: gw\r\n\r\n")
            got = await _read_all(reader, PATIENT_S)
            assert got.startswith(b"HTTP/1.1 200") and got.endswith(b"}")
            writer.close()

    run(scenario())


def test_a_slow_request_head_gets_408_after_the_header_timeout(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Env(tmp_path, clients={"header_timeout_s": 0.4, "idle_timeout_s": 30}) as env:
            reader, writer = await asyncio.open_connection("127.0.0.1", env.gw.port)  # type: ignore[union-attr]
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n")

            async def drip() -> None:  # one header byte every 50 ms: the head never completes
                writer.write(b"X-Slow: ")
                while True:  # for longer than PATIENT_S: a deadline each byte put off never comes
                    writer.write(b"y")
                    await asyncio.sleep(0.05)

            dripper = asyncio.create_task(drip())
            got = await _read_all(reader, PATIENT_S)
            dripper.cancel()
            writer.close()
            head, _, body = got.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 408") and error_of(body)["code"] == "request_timeout"
            assert await env.metric("pdfleet_gateway_requests_total", status="408") == 1

    run(scenario())


def test_a_slow_pipelined_head_is_cut_only_after_the_response_before_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Env(tmp_path, delay=0.1, clients={"header_timeout_s": 0.3}) as env:
            reader, writer = await asyncio.open_connection("127.0.0.1", env.gw.port)  # type: ignore[union-attr]
            body = json.dumps(chat(stream=True, max_tokens=8)).encode()
            writer.write(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (USER_KEY.encode(), len(body), body)
            )
            await asyncio.sleep(0.05)
            writer.write(b"GET /health HTTP/1.1\r\nHost: g")  # the next head, never finished
            got = await _read_all(reader, PATIENT_S)
            writer.close()
            stream, _, rest = got.partition(b"0\r\n\r\n")  # the stream's last chunk, then the 408
            assert stream.startswith(b"HTTP/1.1 200") and stream.count(b"data: ") == 9  # whole
            assert b"[DONE]" in stream and b"408" not in stream
            assert rest.startswith(b"HTTP/1.1 408")

    run(scenario())


def test_a_slow_authenticated_body_gets_408_after_the_body_timeout(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Env(tmp_path, clients={"body_timeout_s": 0.4}) as env:
            reader, writer = await asyncio.open_connection("127.0.0.1", env.gw.port)  # type: ignore[union-attr]
            writer.write(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\n"
                b'Content-Length: 5000\r\n\r\n{"model": ' % USER_KEY.encode()
            )
            got = await _read_all(reader, PATIENT_S)  # the gateway answers and closes; the body never ends
            writer.close()
            head, _, body = got.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 408") and b"Connection: close" in head
            assert error_of(body)["code"] == "request_timeout" and "0.4 s" in error_of(body)["message"]
            assert not env.colo.seen and not env.dis.seen

    run(scenario())


def test_connections_per_address_are_capped(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Env(tmp_path, clients={"max_connections_per_address": 3}) as env:
            port = env.gw.port  # type: ignore[union-attr]
            held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
            await asyncio.sleep(0.05)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            got = await _read_all(reader, 5)
            writer.close()
            head, _, body = got.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 429") and error_of(body)["code"] == "too_many_connections"
            # the held connections still work, and closing one frees a place
            r0, w0 = held[0]
            w0.write(b"GET /health HTTP/1.1\r\nHost: gw\r\n\r\n")
            assert (await r0.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
            held[1][1].close()
            await asyncio.sleep(0.1)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /health HTTP/1.1\r\nHost: gw\r\n\r\n")
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
            for _, w in [held[0], held[2], (reader, writer)]:
                w.close()
            await asyncio.sleep(0.1)
            assert await env.metric("pdfleet_gateway_requests_total", status="429") == 1

    run(scenario())


# ---- request lines the gateway does not serve (N1, N16) -------------------------------------------

UNSERVED = [
    b"CONNECT  ",  # no target, no version: aiohttp took it for a tunnel and held it past every deadline
    b"CONNECT ",
    b"CONNECT gw:443 HTTP/1.1",  # the gateway is no proxy
    b"GET /health",  # HTTP/0.9 style: answered with an 'HTTP/0.9 200' status line
    b"GET /health HTTP/0.9",
    b"GET /health HTTP/2.0",  # answered with an 'HTTP/2.0 200' status line
    b"POST /v1/chat/completions",  # no version: it was proxied
]


@pytest.mark.parametrize(
    "tail", [b"", b"Host: gw\r\nContent-Length: %d\r\n" % len(GOOD)], ids=["bare", "headers"]
)
def test_request_lines_the_gateway_does_not_serve_get_a_400_and_a_close(tmp_path: Path, tail: bytes) -> None:
    async def scenario() -> None:
        async with Env(tmp_path, clients={"header_timeout_s": 30, "idle_timeout_s": 30}) as env:
            for line in UNSERVED:
                reader, writer = await asyncio.open_connection("127.0.0.1", env.gw.port)  # type: ignore[union-attr]
                auth = b"Authorization: Bearer %s\r\n" % USER_KEY.encode()
                writer.write(line + b"\r\n" + auth + tail + b"\r\n" + (GOOD if tail else b""))
                got = await _read_all(reader, PATIENT_S)  # answered and closed before any deadline (30 s)
                writer.close()
                head, _, body = got.partition(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.0 400 ") or head.startswith(b"HTTP/1.1 400 "), (line, head)
                assert error_of(body)["code"] == "invalid_http_request", line
                if not line.endswith(b"HTTP/1.1"):  # llhttp may refuse a CONNECT's headers itself
                    assert "HTTP/1.0 and 1.1 only" in error_of(body)["message"], line
                assert_no_key(got)
            assert not env.colo.seen and not env.dis.seen  # nothing was proxied

    run(scenario())


# ---- random raw requests against one real gateway ------------------------------------------------


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Env, LogCapture]]:
    """One gateway on 127.0.0.1 with short client deadlines, and every log line it writes."""
    loop = LoopThread()
    e = Env(
        tmp_path_factory.mktemp("gw-raw"),
        upstream_model="meta/llama",
        clients={"header_timeout_s": 1, "body_timeout_s": 1, "idle_timeout_s": 5},
        listen={"host": "127.0.0.1", "port": 0, "admin_port": 0},
    )
    with LogCapture() as logs:
        loop.run(e.__aenter__)
        try:
            yield e, logs
        finally:
            loop.run(lambda: e.__aexit__(None, None, None))
            loop.close()


_NASTY = st.sampled_from(
    [b"\r", b"\n", b"\x00", b"\x01", b" ", b"\t", b":", b"\r\n", b"\r\n ", b"\x7f", b"\xff"]
)
_SPLICE = st.lists(st.binary(min_size=1, max_size=8) | _NASTY, min_size=1, max_size=4).map(b"".join)
_KEY = st.sampled_from([USER_KEY.encode(), ADMIN_KEY.encode()])
_EXTRA = st.tuples(
    st.sampled_from(
        [
            b"Content-Length",
            b"Transfer-Encoding",
            b"Content-Encoding",
            b"X-Pdfleet-Pool",
            b"X-Session-Id",
            b"X-Request-Id",
            b"Expect",
            b"Connection",
            b"Accept",
            b"Authorization",
            b"X-Key",
        ]
    ),
    st.sampled_from([b"chunked", b"gzip", b"deflate", b"100-continue", b"close", b"disagg", b"7", b"x"])
    | _KEY,
)


_ODD_METHODS = st.sampled_from([b"CONNECT", b"PRI", b"OPTIONS", b"HEAD", b"PUT", b"DELETE", b"TRACE"])
_ODD_VERSIONS = st.sampled_from(
    [b"", b" ", b" HTTP/0.9", b" HTTP/2.0", b" HTTP/2", b" HTTP/1.2", b" http/1.1"]
)


@st.composite
def _raw_requests(draw: st.DrawFn) -> bytes:
    """A valid request (a configured key in its Authorization line, maybe in other headers too) with up
    to three runs of random bytes spliced anywhere into its request line and headers."""
    method = draw(st.sampled_from([b"POST", b"GET"]) | _ODD_METHODS)
    path = draw(
        st.sampled_from([b"/v1/chat/completions", b"/v1/completions", b"/admin/policy", b"/v1/models"])
        | st.sampled_from([b"/admin/stage", b"*", b"", b"gw:443", b"/health"])
    )
    key = draw(_KEY)
    version = draw(st.sampled_from([b" HTTP/1.1", b" HTTP/1.0"]) | _ODD_VERSIONS)
    lines = [method + b" " + path + version]
    lines += [b"Host: gw", b"Authorization: Bearer " + key, b"Content-Type: application/json"]
    lines += [name + b": " + value for name, value in draw(st.lists(_EXTRA, max_size=3))]
    body = json.dumps(
        chat(max_tokens=1)
        if path == b"/v1/chat/completions"
        else {"version": 1, "stage": "colocated"}
        if path == b"/admin/stage"
        else {"model": "llama", "prompt": "p"}
    )
    if method == b"POST":
        lines.append(b"Content-Length: %d" % len(body))
    head = b"\r\n".join(lines)
    for at, junk in sorted(
        draw(st.lists(st.tuples(st.integers(0, len(head)), _SPLICE), max_size=3)), reverse=True
    ):
        head = head[:at] + junk + head[at:]
    return head + b"\r\n\r\n" + (body.encode() if method == b"POST" else b"")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=_raw_requests(), admin=st.booleans())
def test_random_raw_requests_get_no_5xx_no_hang_and_leak_no_key(
    live: tuple[Env, LogCapture], raw: bytes, admin: bool
) -> None:
    """The client and the admin port: an answer (or a close) within the head deadline (1 s) plus a
    margin, never a 5xx, no key in the answer or the log."""
    env, logs = live
    seen = len(logs.lines)
    port = env.gw.admin_port if admin else env.gw.port  # type: ignore[union-attr]
    status, body = raw_exchange(port, raw, timeout=4)  # a socket timeout (a hang) fails the example
    event(f"{'admin' if admin else 'client'} status {status}")
    assert status < 500, (raw, body)
    if status >= 400 and not raw.startswith(b"HEAD "):  # a HEAD's answer has no body
        error_of(body)
    assert_no_key(body, "\n".join(logs.lines[seen:]))
    assert "Traceback" not in "\n".join(logs.lines[seen:])


def test_nothing_the_random_requests_caused_logged_a_key_or_a_traceback(live: tuple[Env, LogCapture]) -> None:
    # lines written after the example that caused them had its answer are checked here
    _, logs = live
    assert_no_key(logs.text)
    assert "Traceback" not in logs.text


def test_an_undecodable_body_the_handler_never_reads_logs_no_traceback(tmp_path: Path) -> None:
    body = b"not deflate data at all"
    raw = (
        b"POST /v1/models HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\nContent-Encoding: deflate\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (USER_KEY.encode(), len(body), body)
    )

    async def scenario() -> None:
        async with Env(tmp_path) as env:
            with LogCapture() as logs:
                status, _ = await asyncio.to_thread(raw_exchange, env.gw.port, raw)  # type: ignore[union-attr]
                await asyncio.sleep(0.1)  # aiohttp reads the unread body after the answer
            assert status == 405
            assert "Traceback" not in logs.text and len(logs.lines) <= 1, logs.lines

    run(scenario())

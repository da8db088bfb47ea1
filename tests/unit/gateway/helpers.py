"""Loopback helpers for gateway tests: a small OpenAI-like upstream that streams SSE slowly, policy files,
a thread that runs servers on its own event loop (for the synchronous OpenAI SDK), and a raw server
that sends exactly the bytes a test chooses (for the upstream client)."""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import uvloop
import yaml
from aiohttp import web

from pdfleet.errors import ValidationError
from pdfleet.gateway.app import Gateway, Running, start
from pdfleet.gateway.keys import hash_key
from pdfleet.gateway.policy import ActivePolicy, load_policy
from pdfleet.gateway.upstream import UpstreamClient

USER_KEY = "sk-user-0123456789abcdef"
ADMIN_KEY = "sk-admin-fedcba9876543210"


@dataclass
class FakeUpstream:
    """An OpenAI-like upstream: `mode` ok | 500 | hang | cut (stream breaks after `cut_after` chunks)
    | empty (200 with an empty body, SSE when streaming); `end_delay`: seconds between a stream's last
    event and the end of its body; `hold`: while set to an event not yet set, requests wait for it before
    any answer (out for as long as a test needs, however slowly a loaded machine runs it)."""

    name: str
    delay: float = 0.0
    mode: str = "ok"
    cut_after: int = 2
    end_delay: float = 0.0
    seen: list[dict[str, Any]] = field(default_factory=list)
    cancelled: int = 0
    finished: int = 0
    hold: asyncio.Event | None = None
    runner: web.AppRunner | None = None
    port: int = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        app.router.add_post("/v1/completions", self._handle)
        return app

    async def start(self, port: int = 0) -> None:
        self.runner = web.AppRunner(self.app(), handler_cancellation=True, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", port, reuse_address=True)
        await site.start()
        self.port = self.runner.addresses[0][1]

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = json.loads(raw)
        self.seen.append({"headers": request.headers.copy(), "body": body, "raw": raw, "path": request.path})
        if self.hold is not None:
            await self.hold.wait()
        if self.mode == "500":
            return web.json_response({"error": {"message": "engine dead", "code": 500}}, status=500)
        if self.mode == "empty":
            if body.get("stream"):
                resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                await resp.prepare(request)
                await resp.write_eof()
                return resp
            return web.Response(body=b"", content_type="application/json")
        try:
            if self.mode == "hang":
                await asyncio.sleep(3600)
            n = int(body.get("max_tokens") or 8)
            chat = request.path.endswith("chat/completions")
            if body.get("stream"):
                return await self._stream(request, body, n, chat)
            await asyncio.sleep(self.delay * n)
            text = "".join(f"t{i} " for i in range(n))
            if chat:
                choice = {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "length",
                }
                obj = "chat.completion"
            else:
                choice = {"index": 0, "text": text, "finish_reason": "length", "logprobs": None}
                obj = "text_completion"
            if self.mode == "cut":  # announce the whole body, send half of it, drop the connection
                full = json.dumps({"choices": [choice], "pad": "x" * 4096}).encode()
                resp = web.StreamResponse(headers={"Content-Type": "application/json"})
                resp.content_length = len(full)
                await resp.prepare(request)
                await resp.write(full[: len(full) // 2])
                await asyncio.sleep(0.05)
                assert request.transport is not None
                request.transport.abort()
                return resp
            self.finished += 1
            return web.json_response(
                {
                    "id": "cmpl-1",
                    "object": obj,
                    "created": int(time.time()),
                    "model": body["model"],
                    "served_by": self.name,
                    "choices": [choice],
                    "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1},
                }
            )
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    async def _stream(
        self, request: web.Request, body: dict[str, Any], n: int, chat: bool
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(n):
            if self.mode in ("cut", "cut-mid-event") and i == self.cut_after:
                assert request.transport is not None
                if self.mode == "cut-mid-event":  # half an event, then the connection drops
                    await resp.write(b'data: {"id": "c1", "object": "chat.completion.chunk", "choi')
                    await asyncio.sleep(0.05)
                request.transport.abort()
                return resp
            if self.delay:
                await asyncio.sleep(self.delay)
            if chat:
                choice = {"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}
                obj = "chat.completion.chunk"
            else:
                choice = {"index": 0, "text": f"t{i} ", "finish_reason": None, "logprobs": None}
                obj = "text_completion"
            chunk = {
                "id": "c1",
                "object": obj,
                "created": 0,
                "model": body["model"],
                "choices": [choice],
                "served_by": self.name,
            }
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        if self.end_delay:
            await asyncio.sleep(self.end_delay)
        await resp.write_eof()
        self.finished += 1
        return resp


def write_keys(path: Path, mode: int = 0o600) -> Path:
    """A keys file with one user and one admin key, at `mode`."""
    data = {
        "keys": [
            {"name": "user", "sha256": hash_key(USER_KEY)},
            {"name": "admin", "sha256": hash_key(ADMIN_KEY), "admin": True},
        ]
    }
    path.write_text(yaml.safe_dump(data))
    os.chmod(path, mode)
    return path


def policy_dict(colocated: list[str], disagg: str | None, **over: Any) -> dict[str, Any]:
    """A valid policy as a dict (tests tweak it before writing)."""
    pol: dict[str, Any] = {
        "version": 1,
        "listen": {"host": "127.0.0.1", "port": 0},
        "keys_file": "keys.yaml",
        "models": {"llama": {"colocated": colocated, "disagg": disagg}},
        "long_prompt_tokens": 1000,
        "stage": "long-all",
        "stages": {
            "off": {"short": 0, "long": 0},
            "long-all": {"short": 0, "long": 100},
            "half": {"short": 50, "long": 50},
        },
        "timeouts": {"connect_s": 2, "first_byte_s": 5, "idle_s": 5},
        "log_requests": False,
    }
    pol.update(over)
    return pol


def write_policy(directory: Path, pol: dict[str, Any]) -> Path:
    """Write policy.yaml (and the keys file beside it when missing)."""
    if not (directory / "keys.yaml").exists():
        write_keys(directory / "keys.yaml")
    path = directory / "policy.yaml"
    path.write_text(yaml.safe_dump(pol, sort_keys=False))
    return path


COLO = ["http://127.0.0.1:8001"]
DIS = "http://127.0.0.1:8090"


def load_test_policy(tmp_path: Path, **over: Any) -> ActivePolicy:
    """A loaded policy (COLO and DIS as pools) written to `tmp_path`, with `over` applied."""
    return load_policy(write_policy(tmp_path, policy_dict(COLO, DIS, **over)))


def policy_error(tmp_path: Path, pol: dict[str, Any]) -> str:
    """The validation message loading `pol` from `tmp_path` raises."""
    path = write_policy(tmp_path, pol)
    with pytest.raises(ValidationError) as exc:
        load_policy(path)
    return str(exc.value)


def auth(key: str = USER_KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


class Env:
    """Two fake upstreams (colocated, disagg), a gateway in front of them and a client session;
    `upstream_model` renames the model alias upstream; `models(colo_url, dis_url)` replaces the aliases."""

    def __init__(
        self,
        tmp: Path,
        delay: float = 0.0,
        upstream_model: str | None = None,
        models: Callable[[str, str], dict[str, Any]] | None = None,
        **policy_over: Any,
    ):
        self.tmp = tmp
        self.models = models
        self.colo = FakeUpstream("colo", delay=delay)
        self.dis = FakeUpstream("dis", delay=delay)
        self.upstream_model = upstream_model
        self.policy_over = policy_over
        self.gw: Running | None = None
        self.session: Any = None

    async def __aenter__(self) -> Env:
        import aiohttp

        await self.colo.start()
        await self.dis.start()
        self.policy = policy_dict([self.colo.url], self.dis.url, **self.policy_over)
        if self.upstream_model is not None:
            self.policy["models"]["llama"]["upstream_model"] = self.upstream_model
        if self.models is not None:
            self.policy["models"] = self.models(self.colo.url, self.dis.url)
        self.path = write_policy(self.tmp, self.policy)
        self.gw = await start(Gateway(self.path, load_policy(self.path), shutdown_timeout=5))
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.session.close()
        assert self.gw is not None
        await self.gw.close()
        await self.colo.stop()
        await self.dis.stop()

    @property
    def base(self) -> str:
        assert self.gw is not None
        scheme = "https" if self.gw.gateway.tls else "http"
        return f"{scheme}://127.0.0.1:{self.gw.port}"

    def rewrite_policy(self, **over: Any) -> None:
        """Write a changed policy file (the gateway sees it on reload)."""
        self.policy = {**self.policy, **over}
        write_policy(self.tmp, self.policy)

    async def post(
        self, path: str, body: Any, headers: dict[str, str] | None = None, raw: bytes | None = None
    ) -> tuple[int, Any, bytes]:
        hdrs = {**auth(), **(headers or {})}
        data = raw if raw is not None else json.dumps(body).encode()
        async with self.session.post(self.base + path, data=data, headers=hdrs) as r:
            return r.status, r.headers.copy(), await r.read()

    async def metric(self, name: str, **labels: str) -> float:
        """Sum of a metric's samples whose labels include `labels`."""
        from prometheus_client.parser import text_string_to_metric_families

        async with self.session.get(self.base + "/metrics") as r:
            text = await r.text()
        total = 0.0
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    total += s.value
        return total


def chat(content: str = "hi", stream: bool = False, **extra: Any) -> dict[str, Any]:
    return {"model": "llama", "messages": [{"role": "user", "content": content}], "stream": stream, **extra}


LONG = "word " * 1200  # 6000 chars -> 1500 tokens at 4 chars/token: long at threshold 1000


def sse_events(raw: bytes) -> list[str]:
    """The `data:` payloads of an SSE body, in order."""
    return [line[6:] for line in raw.decode().split("\n") if line.startswith("data: ")]


def run(coro: Any) -> Any:
    """Run a test scenario on a fresh asyncio loop."""
    return asyncio.run(coro)


def error_of(raw: bytes) -> dict[str, Any]:
    """The error object of an OpenAI error body, checked for its shape."""
    body = json.loads(raw)
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    return err


# (case, method, path, headers (None: user key), body, status, message fragment)
Malformed = tuple[str, str, str, dict[str, str] | None, bytes | None, int, str]


async def check_malformed(tmp_path: Path, case: Malformed) -> None:
    """The gateway answers `case` with its documented status and message, reaches no upstream, stays up."""
    _name, method, path, headers, body, status, fragment = case
    # a renaming route: every case also goes through re-encoding the body for the upstream
    async with Env(tmp_path, upstream_model="meta/llama", max_body_bytes=65536) as env:
        hdrs = auth() if headers is None else headers
        with LogCapture() as logs:
            async with env.session.request(method, env.base + path, data=body, headers=hdrs) as r:
                raw = await r.read()
                assert r.status == status, raw
            await asyncio.sleep(0.05)  # what the gateway logs after answering, too
        err = error_of(raw)
        assert fragment in err["message"]
        assert_no_key(raw, logs.text)
        assert "Traceback" not in logs.text, logs.text
        assert not env.colo.seen and not env.dis.seen  # nothing reached an upstream
        async with env.session.get(env.base + "/health") as r:
            assert r.status == 200
        st, _, _ = await env.post("/v1/chat/completions", chat())
        assert st == 200


# ---- raw requests: bytes no HTTP client library would send --------------------------------------


def raw_exchange(port: int, raw: bytes, timeout: float = 10.0) -> tuple[int, bytes]:
    """Send `raw` to the gateway on 127.0.0.1 over a real socket; (status, body) of the one response
    (status 0: the gateway closed the connection without one)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(raw)
        method = raw.split(b" ", 1)[0].decode("latin-1")  # a HEAD's answer has no body to wait for
        resp = http.client.HTTPResponse(sock, method=method)
        try:
            resp.begin()
        except http.client.RemoteDisconnected:
            return 0, b""
        return resp.status, resp.read()


class LogCapture(logging.Handler):
    """Every log record of every logger, formatted as the journal would show it (tracebacks too)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        self.lines: list[str] = []
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.lines.append(self.format(record))

    def __enter__(self) -> LogCapture:
        root = logging.getLogger()
        self._level = root.level
        root.addHandler(self)
        root.setLevel(logging.DEBUG)
        return self

    def __exit__(self, *exc: object) -> None:
        root = logging.getLogger()
        root.removeHandler(self)
        root.setLevel(self._level)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def assert_no_key(*texts: bytes | str) -> None:
    """Neither configured key appears in any of `texts` (response bodies, log text)."""
    for text in texts:
        raw = text if isinstance(text, bytes) else text.encode("utf-8", "replace")
        for key in (USER_KEY, ADMIN_KEY):
            assert key.encode() not in raw, f"a configured key leaked: {raw[:300]!r}"


class LoopThread:
    """An event loop in a background thread, for servers used by synchronous clients."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro_fn: Callable[[], Any], timeout: float = 30) -> Any:
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro_fn(), self.loop)
        return fut.result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


# ---- raw upstreams for the upstream client -------------------------------------------------------

Reply = Callable[[bytes], list[bytes]]  # request bytes -> the pieces written back, in order


@dataclass
class RawServer:
    """A loopback server that answers each request with `reply(request)` pieces, `gap` seconds apart."""

    reply: Reply
    gap: float = 0.0
    close_after_reply: bool = False
    # drop the connection, unanswered, on the request after this many replies on it: an origin closing
    # an idle keep-alive connection just as the next request goes out
    drop_after: int | None = None
    connections: int = 0
    open: int = 0  # connections the client has not closed yet
    requests: list[bytes] = field(default_factory=list)
    server: asyncio.Server | None = None

    async def __aenter__(self) -> RawServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open += 1
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                req = head + await reader.readexactly(length)
                self.requests.append(req)
                if self.drop_after is not None and served >= self.drop_after:
                    break
                served += 1
                for piece in self.reply(req):
                    writer.write(piece)
                    await writer.drain()
                    if self.gap:
                        await asyncio.sleep(self.gap)
                if self.close_after_reply:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.open -= 1
            writer.close()


def chunked(*payloads: bytes) -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in payloads)
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        + body
        + (b"0\r\n\r\n")
    )


class Sink(asyncio.Protocol):
    """The client side of a real loopback connection: collects what the relay wrote."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.transport: asyncio.Transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.data += data


async def client_pair() -> tuple[asyncio.Transport, Sink, asyncio.AbstractServer]:
    """A connected (transport we write to, sink that receives) pair over loopback TCP."""
    loop = asyncio.get_running_loop()
    accepted: asyncio.Future[asyncio.Transport] = loop.create_future()

    class Accept(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            accepted.set_result(transport)  # type: ignore[arg-type]

    server = await loop.create_server(Accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    sink = Sink()
    await loop.create_connection(lambda: sink, "127.0.0.1", port)
    return await accepted, sink, server


async def fetch(
    client: UpstreamClient, url: str, *, first_byte_s: float = 5.0, idle_s: float = 5.0
) -> tuple[int, bytes, str | None]:
    """POST, then relay the rest (unframed) into a real socket; (status, whole body, end reason)."""
    resp = await client.post(url, "/v1/completions", {}, b"{}", connect_s=1, first_byte_s=first_byte_s)
    transport, sink, server = await client_pair()
    try:
        reason = await resp.relay(transport, False, None, idle_s)
        await asyncio.sleep(0.02)
        return resp.status, resp.first + bytes(sink.data), reason
    finally:
        transport.close()
        server.close()


def run_uvloop(coro: Any) -> None:
    """Run a scenario on uvloop, the loop the gateway runs on in production."""
    uvloop.run(coro)

"""Loopback helpers for gateway tests: a small OpenAI-like upstream that streams SSE slowly, policy files,
and a thread that runs servers on its own event loop (for the synchronous OpenAI SDK)."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from pdfleet.gateway.app import Gateway, Running, start
from pdfleet.gateway.keys import hash_key
from pdfleet.gateway.policy import load_policy

USER_KEY = "sk-user-0123456789abcdef"
ADMIN_KEY = "sk-admin-fedcba9876543210"


@dataclass
class FakeUpstream:
    """An OpenAI-like upstream: `mode` ok | 500 | hang | cut (stream breaks after `cut_after` chunks)
    | empty (200 with an empty body, SSE when streaming)."""

    name: str
    delay: float = 0.0
    mode: str = "ok"
    cut_after: int = 2
    seen: list[dict[str, Any]] = field(default_factory=list)
    cancelled: int = 0
    finished: int = 0
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
            if self.mode == "cut" and i == self.cut_after:
                assert request.transport is not None
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


async def start_gateway(path: Path) -> Running:
    """A gateway on a free loopback port from a policy file."""
    return await start(Gateway(path, load_policy(path), shutdown_timeout=5))


def auth(key: str = USER_KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


class LoopThread:
    """An event loop in a background thread, for servers used by synchronous clients."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro_fn: Callable[[], Awaitable[Any]], timeout: float = 30) -> Any:
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro_fn(), self.loop)  # type: ignore[arg-type]
        return fut.result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class Env:
    """Two fake upstreams (colocated, disagg), a gateway in front of them and a client session."""

    def __init__(self, tmp: Path, delay: float = 0.0, **policy_over: Any) -> None:
        self.tmp = tmp
        self.colo = FakeUpstream("colo", delay=delay)
        self.dis = FakeUpstream("dis", delay=delay)
        self.policy_over = policy_over
        self.gw: Running | None = None
        self.session: Any = None

    async def __aenter__(self) -> Env:
        import aiohttp

        await self.colo.start()
        await self.dis.start()
        self.policy = policy_dict([self.colo.url], self.dis.url, **self.policy_over)
        self.path = write_policy(self.tmp, self.policy)
        self.gw = await start_gateway(self.path)
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
        return f"http://127.0.0.1:{self.gw.port}"

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

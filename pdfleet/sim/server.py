"""One simulated vLLM instance: a `Runtime` (clock, engine, step loop, KV connector) behind its HTTP API.

This module only wires the parts and runs their lifecycle in vLLM's start-up order: the connector and
its side channel, the HTTP port, then the step loop. What each part does is in its own module:
`runtime` (time and steps), `kv_transfer` (P/D), `api` (routes and wire shapes), `stream` (SSE).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os

from aiohttp import web

from pdfleet.chat_template import ChatTemplate, load_chat_template
from pdfleet.sim.api import SimAPI
from pdfleet.sim.config import SimConfig, describe
from pdfleet.sim.intake import ArrivalStamp
from pdfleet.sim.metrics import SimCollector, make_registry
from pdfleet.sim.model_dir import describe_dir
from pdfleet.sim.runtime import Runtime
from pdfleet.sim.stream import Filler
from pdfleet.sim.vocab import filler_for
from pdfleet.tokens import TextCounter, make_counter

log = logging.getLogger("pdfleet.sim")


class SimServer:
    """One simulated vLLM instance: HTTP API, step loop, metrics, and (for P/D) the KV side channel."""

    def __init__(
        self, cfg: SimConfig, counter: TextCounter | None = None, filler: Filler | None = None
    ) -> None:
        self.cfg = cfg
        tokenizer = _tokenizer_file(cfg.tokenizer)
        self.runtime = Runtime(cfg, filler or filler_for(tokenizer))
        self.engine = self.runtime.engine
        self.metrics = self.runtime.metrics
        cache_info = {
            "block_size": str(cfg.block_size),
            "cache_dtype": cfg.kv_cache_dtype,
            "gpu_memory_utilization": str(cfg.gpu_memory_utilization),
            "num_gpu_blocks": str(cfg.num_blocks),
            "enable_prefix_caching": str(cfg.enable_prefix_caching),
        }
        model_name = cfg.served_model_names[0]
        self.registry = make_registry(SimCollector(self.metrics, self.engine, model_name, cache_info))
        template = _chat_template(tokenizer, cfg.chat_template)
        counter = counter or make_counter(tokenizer, cfg.chars_per_token, template)
        self.api = SimAPI(cfg, self.runtime, self.registry, counter, _counter_id(tokenizer, cfg, template))
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None

    def app(self) -> web.Application:
        """The aiohttp application with vLLM's routes."""
        return self.api.app()

    async def start(self, host: str | None = None, port: int | None = None) -> None:
        """Bind the HTTP port (and the side channel on producers) and start the step loop."""
        cfg = self.cfg
        log.info("pdfleet-sim: simulating %s", describe(cfg))
        if cfg.model_dir is not None:  # a local model directory (a staged model): the files it read
            log.info(
                describe_dir(cfg.model_dir, tokenizer_runs=cfg.tokenizer == cfg.model_dir.tokenizer_file)
            )
        warning = cfg.release.chunked_prefill.disable_warning
        if not cfg.enable_chunked_prefill and warning:
            log.warning(warning)  # the release honours --no-enable-chunked-prefill, with vLLM's warning
        await self.runtime.open()
        # handler_cancellation: a client that goes away cancels its handler, which aborts the request
        self._runner = web.AppRunner(
            self.app(), access_log=None, handle_signals=False, handler_cancellation=True
        )
        await self._runner.setup()
        bind_host = cfg.host if host is None else host
        loop = asyncio.get_running_loop()
        factory = self._runner.server
        assert factory is not None
        # each connection's aiohttp protocol wrapped to stamp a request's first byte (its arrival)
        self._listener = await loop.create_server(
            lambda: ArrivalStamp(factory(), loop.time),
            bind_host or None,
            cfg.port if port is None else port,
            reuse_address=True,
        )
        self.runtime.start()
        log.info("Starting vLLM API server 0 on http://%s:%d", bind_host or "0.0.0.0", self.bound_port())
        log.info("Application startup complete.")

    def bound_port(self) -> int:
        """The HTTP port actually bound (useful with port 0)."""
        assert self._listener is not None
        sockets = self._listener.sockets
        return int(sockets[0].getsockname()[1]) if sockets else self.cfg.port

    async def stop(self) -> None:
        """Stop stepping, fail whatever is in flight, close the ports."""
        await self.runtime.stop()
        if self._listener is not None:
            self._listener.close()
        if self._runner is not None:
            await self._runner.cleanup()
        self.api.close()


def _tokenizer_file(path: str | None) -> str | None:
    """tokenizer.json from --tokenizer (a file or a directory holding one), else None (character estimate)."""
    if not path:
        return None
    if os.path.isdir(path):
        candidate = os.path.join(path, "tokenizer.json")
        return candidate if os.path.isfile(candidate) else None
    return path if os.path.isfile(path) else None


def _chat_template(tokenizer_file: str | None, override: str | None) -> ChatTemplate | None:
    """The chat template beside the tokenizer (or --chat-template's), which chat prompts are rendered with
    as vLLM renders them; None without a tokenizer (the estimate) or a template."""
    if tokenizer_file is None:
        return None
    try:
        import jinja2  # noqa: F401 (only whether it imports: pdfleet.chat_template renders with it)
    except ImportError:  # a host with the tokenizer but not jinja2: counted as before
        log.warning("pdfleet-sim: jinja2 is not installed: chat prompts counted without the chat template")
        return None
    return load_chat_template(os.path.dirname(os.path.abspath(tokenizer_file)), override)


def _counter_id(tokenizer_file: str | None, cfg: SimConfig, template: ChatTemplate | None = None) -> str:
    """What a prompt count depends on: the tokenizer file's content and the chat template, or the
    character estimate's ratio."""
    if tokenizer_file is None:
        return f"chars/{cfg.chars_per_token}"
    with open(tokenizer_file, "rb") as fh:
        digest = hashlib.file_digest(fh, "sha256")
    if template is not None:
        digest.update(repr(sorted(template.templates.items())).encode())
    return "tokenizer/" + digest.hexdigest()[:16]

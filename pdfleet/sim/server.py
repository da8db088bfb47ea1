"""One simulated vLLM instance: a `Runtime` (clock, engine, step loop, KV connector) behind its HTTP API.

This module only wires the parts and runs their lifecycle in vLLM's start-up order: the connector and
its side channel, the HTTP port, then the step loop. What each part does is in its own module:
`runtime` (time and steps), `kv_transfer` (P/D), `api` (routes and wire shapes), `stream` (SSE).
"""

from __future__ import annotations

import logging
import os

from aiohttp import web

from pdfleet.sim.api import SimAPI
from pdfleet.sim.config import SimConfig, describe
from pdfleet.sim.metrics import SimCollector, make_registry
from pdfleet.sim.runtime import Runtime
from pdfleet.tokens import TextCounter, make_counter

log = logging.getLogger("pdfleet.sim")


class SimServer:
    """One simulated vLLM instance: HTTP API, step loop, metrics, and (for P/D) the KV side channel."""

    def __init__(self, cfg: SimConfig, counter: TextCounter | None = None) -> None:
        self.cfg = cfg
        self.runtime = Runtime(cfg)
        self.engine = self.runtime.engine
        self.metrics = self.runtime.metrics
        cache_info = {
            "block_size": str(cfg.block_size),
            "cache_dtype": cfg.kv_cache_dtype,
            "gpu_memory_utilization": str(cfg.gpu_memory_utilization),
            "num_gpu_blocks": str(cfg.num_blocks),
            "enable_prefix_caching": "False",
        }
        model_name = cfg.served_model_names[0]
        self.registry = make_registry(SimCollector(self.metrics, self.engine, model_name, cache_info))
        counter = counter or make_counter(_tokenizer_file(cfg.tokenizer), cfg.chars_per_token)
        self.api = SimAPI(cfg, self.runtime, self.registry, counter)
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        """The aiohttp application with vLLM's routes."""
        return self.api.app()

    async def start(self, host: str | None = None, port: int | None = None) -> None:
        """Bind the HTTP port (and the side channel on producers) and start the step loop."""
        cfg = self.cfg
        log.info("pdfleet-sim: simulating %s", describe(cfg))
        await self.runtime.open()
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await self._runner.setup()
        bind_host = cfg.host if host is None else host
        site = web.TCPSite(self._runner, bind_host, cfg.port if port is None else port, reuse_address=True)
        await site.start()
        self.runtime.start()
        log.info("Starting vLLM API server 0 on http://%s:%d", bind_host or "0.0.0.0", self.bound_port())
        log.info("Application startup complete.")

    def bound_port(self) -> int:
        """The HTTP port actually bound (useful with port 0)."""
        assert self._runner is not None
        addresses = self._runner.addresses
        return int(addresses[0][1]) if addresses else self.cfg.port

    async def stop(self) -> None:
        """Stop stepping, fail whatever is in flight, close the ports."""
        await self.runtime.stop()
        if self._runner is not None:
            await self._runner.cleanup()


def _tokenizer_file(path: str | None) -> str | None:
    """tokenizer.json from --tokenizer (a file or a directory holding one), else None (character estimate)."""
    if not path:
        return None
    if os.path.isdir(path):
        candidate = os.path.join(path, "tokenizer.json")
        return candidate if os.path.isfile(candidate) else None
    return path if os.path.isfile(path) else None

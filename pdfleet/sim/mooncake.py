"""MooncakeConnector's side of the P/D protocol (vLLM 0.33's `kv_connector/v1/mooncake/`), as the
simulator plays it for `vllm-router --kv-connector mooncake`.

What the router drives (vllm-router 0.1.17, observed on loopback; vLLM's `mooncake_connector.py` and
`mooncake_utils.py` for the engine's side):

- at start the router GETs `/query` on each prefill's bootstrap server (`--prefill URL BOOTSTRAP_PORT`)
  for its engine id per DP rank;
- per request it sends P `{"do_remote_decode": true, "do_remote_prefill": false, "transfer_id":
  "xfer-<uuid>"}` (max_tokens 1, not streamed), then D `{"do_remote_decode": false, "do_remote_prefill":
  true, "transfer_id", "remote_bootstrap_addr": "http://P:BOOTSTRAP_PORT", "remote_engine_id"}`;
- P holds a length-capped prefill's blocks under its transfer_id and returns no kv_transfer_params (its
  `request_finished` returns None), until D has read them or VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT passes;
- D GETs `remote_bootstrap_addr + "/query"` for the engine's worker address (`tcp://host:port`, which
  P's worker registered with `POST /register`) and reads the blocks from it.

The bootstrap server here is that HTTP API (routes, payload and answers as `MooncakeBootstrapServer`'s);
the worker address leads to the simulator's side channel (`pdfleet.sim.side_channel`), standing in for
ZMQ and the transfer engine's RDMA writes, timed by `--sim-link` like NIXL's reads.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

log = logging.getLogger("pdfleet.sim.mooncake")

# The keys D needs (MooncakeConnectorScheduler.update_state_after_alloc), and the one P needs
# (request_finished); without them vLLM serves the request without a transfer.
CONSUMER_KEYS = ("remote_engine_id", "remote_bootstrap_addr", "transfer_id")
PRODUCER_KEY = "transfer_id"
# request_finished hands blocks over only for this RequestStatus (any other finish frees them)
HANDED_OVER = "FINISHED_LENGTH_CAPPED"
QUERY_TIMEOUT_S = 30.0  # VLLM_MOONCAKE_CONNECTOR_TIMEOUT's default, wall seconds
_PAYLOAD = {"engine_id": str, "dp_rank": int, "tp_rank": int, "pp_rank": int, "addr": str}


class BootstrapError(Exception):
    """D could not learn where P's worker listens (bootstrap server unreachable, engine unknown)."""


def registration_error(payload: Any, workers: dict[int, dict[str, Any]]) -> tuple[int, Any] | None:
    """Why a `POST /register` is refused (FastAPI's 422 for a payload that is not a
    RegisterWorkerPayload, vLLM's 400 for a conflict), None when it is accepted."""
    if not isinstance(payload, dict):
        return 422, [{"type": "model_attributes_type", "loc": ["body"], "msg": "Input should be an object"}]
    missing = [
        {
            "type": "missing" if name not in payload else f"{kind.__name__}_type",
            "loc": ["body", name],
            "msg": "Field required" if name not in payload else f"Input should be a valid {kind.__name__}",
        }
        for name, kind in _PAYLOAD.items()
        if name not in payload or not isinstance(payload[name], kind) or isinstance(payload[name], bool)
    ]
    if missing:
        return 422, missing
    entry = workers.get(payload["dp_rank"])
    if entry is not None and entry["engine_id"] != payload["engine_id"]:
        return 400, (
            f"Engine ID mismatch for dp_rank={payload['dp_rank']}: expected {entry['engine_id']}, "
            f"got {payload['engine_id']}"
        )
    existing = (entry or {}).get("worker_addr", {}).get(payload["tp_rank"], {}).get(payload["pp_rank"])
    if existing is not None and existing != payload["addr"]:
        return 400, (
            f"Worker with dp_rank={payload['dp_rank']}, tp_rank={payload['tp_rank']}, "
            f"pp_rank={payload['pp_rank']} is already registered at {existing}, but still want to "
            f"register at {payload['addr']}"
        )
    return None


class BootstrapServer:
    """P's bootstrap server: workers register their address, decoders and the router query them."""

    def __init__(self) -> None:
        self.workers: dict[int, dict[str, Any]] = {}  # dp_rank -> {engine_id, worker_addr{tp{pp: addr}}}
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        """The two routes of MooncakeBootstrapServer."""
        app = web.Application()
        app.router.add_post("/register", self._register)
        app.router.add_get("/query", self._query)
        return app

    async def start(self, host: str, port: int) -> None:
        """Listen on host:port (VLLM_MOONCAKE_BOOTSTRAP_PORT)."""
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port).start()
        log.info("Mooncake Bootstrap Server started at %s:%d", host, port)

    async def close(self) -> None:
        """Stop listening."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _register(self, request: web.Request) -> web.Response:
        try:
            payload = await request.json()
        except ValueError:
            payload = None
        refused = registration_error(payload, self.workers)
        if refused is not None:
            return web.json_response({"detail": refused[1]}, status=refused[0])
        fresh = {"engine_id": payload["engine_id"], "worker_addr": {}}
        entry = self.workers.setdefault(payload["dp_rank"], fresh)
        entry["worker_addr"].setdefault(payload["tp_rank"], {})[payload["pp_rank"]] = payload["addr"]
        return web.json_response({"status": "ok"})

    async def _query(self, request: web.Request) -> web.Response:
        return web.json_response(self.workers)  # JSON turns the int ranks into strings, as FastAPI does


async def register(bootstrap: str, payload: dict[str, Any]) -> None:
    """A worker registers its address with its engine's bootstrap server (`http://host:port`)."""
    timeout = aiohttp.ClientTimeout(total=QUERY_TIMEOUT_S)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.post(bootstrap + "/register", json=payload) as resp,
    ):
        if resp.status != 200:
            raise BootstrapError(
                f"Failed to register {payload} with the Mooncake bootstrap server at "
                f"{bootstrap}: {resp.status} {await resp.text()}"
            )


async def query(bootstrap_addr: str) -> dict[str, dict[int, dict[int, str]]]:
    """D's `GET remote_bootstrap_addr/query`: each engine's worker addresses by TP and PP rank."""
    try:
        timeout = aiohttp.ClientTimeout(total=QUERY_TIMEOUT_S)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(bootstrap_addr + "/query") as resp,
        ):
            resp.raise_for_status()
            data = await resp.json()
        return {
            str(entry["engine_id"]): {
                int(tp): {int(pp): str(addr) for pp, addr in ranks.items()}
                for tp, ranks in entry["worker_addr"].items()
            }
            for entry in data.values()
        }
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise BootstrapError(f"Failed to connect to bootstrap server {bootstrap_addr}: {exc}") from exc


Engines = dict[str, dict[int, dict[int, str]]]  # engine_id -> {tp_rank: {pp_rank: worker address}}


def worker_endpoint(engines: Engines, engine_id: str, where: str) -> tuple[str, int]:
    """The host and port of an engine's TP 0 / PP 0 worker (`tcp://host:port`)."""
    addr = engines.get(engine_id, {}).get(0, {}).get(0)
    if addr is None:
        raise BootstrapError(f"remote engine_id {engine_id} not found from bootstrap server {where}")
    parts = urlsplit(addr)
    if parts.scheme != "tcp" or not parts.hostname or parts.port is None:
        raise BootstrapError(f"bootstrap server {where}: worker address {addr!r} is not tcp://host:port")
    return parts.hostname, parts.port

"""One instance's side of P/D, as vLLM's NixlConnector plays it, over the simulated clock and link.

- kv_transfer_params in (which role a request takes here) and out (what a producer returns for the
  decode side);
- producer: finished prefills hold their blocks; the side channel gets read grants for them and frees
  them on the consumer's notification, or they expire when the lease runs out;
- consumer: a `remote_prefill` request pulls its KV from the producer, waiting the link's queued
  transfer time, then decodes (or fails / recomputes, per kv_load_failure_policy);
- vLLM's NIXL start-up lines, the nixl_* metrics and the periodic `KV Transfer metrics` line (its keys
  the release's, `sim.transfer_log`; Mooncake's on P, which pushes).

The wire protocol is `pdfleet.sim.side_channel`; the link's timing is `pdfleet.sim.perf.LinkQueue`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from pdfleet.model.connectors import MOONCAKE
from pdfleet.sim import mooncake, transfer_log
from pdfleet.sim.clock import SimClock
from pdfleet.sim.config import KVTransfer, SimConfig
from pdfleet.sim.engine import Engine, SimRequest, State
from pdfleet.sim.kv_library import LibraryError, NixlAgent, Offer
from pdfleet.sim.kv_mooncake import PROTOCOL, MooncakeEngine, start_library
from pdfleet.sim.metrics import SimMetrics
from pdfleet.sim.perf import LinkQueue
from pdfleet.sim.side_channel import PullError, ReadGrant, SideChannelServer, compat_hash, heartbeat, pull
from pdfleet.sim.stream import Sink

log = logging.getLogger("pdfleet.sim")

# The API's finish_reason as vLLM's RequestStatus (the table's finish_statuses are RequestStatus names).
FINISH_STATUS = {"length": "FINISHED_LENGTH_CAPPED", "stop": "FINISHED_STOPPED", "abort": "FINISHED_ABORTED"}


def _hashed_version(cfg: SimConfig, kv: KVTransfer) -> str | None:
    """The release's version when its compatibility hash includes it and the check is not switched off
    (`kv_connector_extra_config.enforce_handshake_compat: false`)."""
    if "vllm_version" not in cfg.release.handshake.hash_factors:
        return None
    return None if kv.extra_config.get("enforce_handshake_compat") is False else cfg.release.version


def missing(grant: ReadGrant, local_tokens: int, block_size: int) -> tuple[int, int]:
    """The blocks and bytes a consumer pulls: the producer's blocks past its own prefix-cache hit of
    `local_tokens` (vLLM's NIXL worker reads only the uncomputed blocks on a partial hit)."""
    if grant.num_blocks <= 0:
        return 0, 0
    blocks = max(grant.num_blocks - local_tokens // block_size, 0)
    return blocks, grant.nbytes * blocks // grant.num_blocks


def _lease_of(kv: KVTransfer) -> float | None:
    """The consumer's own kv_lease_duration (it times its heartbeats by it), None for the default."""
    value = kv.extra_config.get("kv_lease_duration")
    return float(value) if isinstance(value, int | float) else None


class KVConnector:
    """The P/D connector of one simulated instance (producer, consumer or both, per its kv_role)."""

    def __init__(
        self,
        cfg: SimConfig,
        kv: KVTransfer,
        engine: Engine,
        metrics: SimMetrics,
        clock: SimClock,
        wake: Callable[[], None],
    ) -> None:
        self.cfg = cfg
        self.kv = kv
        self.engine = engine
        self.metrics = metrics
        self.clock = clock
        self.wake = wake  # the engine's state changed: an idle step loop should look again
        version = _hashed_version(cfg, kv)
        self.compat = compat_hash(cfg.model_spec.name, cfg.kv_cache_dtype, cfg.block_size, version)
        self._side: SideChannelServer | None = None
        self.mooncake = kv.connector == MOONCAKE
        self._granted: dict[str, ReadGrant] = {}  # Mooncake's P: reads granted, not yet reported done
        self._bootstrap: mooncake.BootstrapServer | None = None
        self._link = LinkQueue(cfg.link)
        self._window: list[transfer_log.Transfer] = []  # transfers since the last `KV Transfer metrics` line
        self._logged_failures: dict[str, int] = {}  # the failure counters at that line
        # real bytes through NIXL or Mooncake's engine (kv_transfer.sim_library), from start()
        self.library: NixlAgent | MooncakeEngine | None = None

    # ---- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        """Log vLLM's connector start-up lines; on a producer, listen on the side channel."""
        kv, cfg = self.kv, self.cfg
        log.info("Creating v1 connector with name: %s and engine_id: %s", kv.connector, kv.engine_id)
        if self.mooncake:
            await self._start_mooncake()
            return
        log.info("Initializing NIXL Scheduler %s", kv.engine_id)
        log.info("Initializing NIXL wrapper")
        log.info("Initializing NIXL worker %s", kv.engine_id)
        if cfg.kv_library is not None:  # the worker fails to start without NIXL, as vLLM's does
            name = f"pdfleet-sim-{kv.engine_id}"
            host = cfg.host or "127.0.0.1"
            self.library = await start_library(cfg.kv_library, "nixl", name, host, kv.is_producer)
        if kv.is_producer:
            renew = self.renew if cfg.release.lease_timing() is not None else None
            self._side = SideChannelServer(kv.engine_id, self.compat, self.grant, self.release, renew)
            await self._side.start(cfg.side_channel_host, cfg.side_channel_port)
            log.info("KV side channel listening on %s:%d", cfg.side_channel_host, cfg.side_channel_port)

    async def _start_mooncake(self) -> None:
        """Mooncake's transfer engine on every instance when the library is on (the worker fails to start
        without it, as vLLM's does); a producer: its worker's listener on a free port, the bootstrap server
        on VLLM_MOONCAKE_BOOTSTRAP_PORT, and the worker registered with it over HTTP, as vLLM's does."""
        host = self.cfg.host or "127.0.0.1"
        if self.cfg.kv_library is not None:
            log.info("The Mooncake Transfer Engine is using %s as its protocol.", PROTOCOL)
            name = f"pdfleet-sim-{self.kv.engine_id}"
            self.library = await start_library(
                self.cfg.kv_library, "mooncake", name, host, self.kv.is_producer
            )
        if not self.kv.is_producer:
            return
        self._side = SideChannelServer(
            self.kv.engine_id, self.compat, self.grant, self.release, pushed=self.pushed
        )
        port = await self._side.start(host, 0)
        self._bootstrap = mooncake.BootstrapServer()
        await self._bootstrap.start(self.cfg.host or "0.0.0.0", self.cfg.mooncake_bootstrap_port)
        payload = {
            "engine_id": self.kv.engine_id,
            "dp_rank": 0,
            "tp_rank": 0,
            "pp_rank": 0,
            "addr": f"tcp://{host}:{port}",
        }
        await mooncake.register(f"http://{host}:{self.cfg.mooncake_bootstrap_port}", payload)

    async def close(self) -> None:
        """Close the side channel and the Mooncake bootstrap server (if this is a producer)."""
        if self._side is not None:
            await self._side.close()
        if self._bootstrap is not None:
            await self._bootstrap.close()
        if self.library is not None:
            self.library.close()

    # ---- kv_transfer_params -----------------------------------------------------------------------
    def role_of(self, body: dict[str, Any]) -> tuple[bool, dict[str, Any] | None]:
        """(remote_decode, remote_prefill params) from the request's kv_transfer_params and our kv_role."""
        params = body.get("kv_transfer_params")
        if not isinstance(params, dict):
            return False, None
        if self.mooncake:
            return self._mooncake_role(params)
        if params.get("do_remote_decode") and self.kv.is_producer:
            return True, None
        if params.get("do_remote_prefill") and self.kv.is_consumer:
            needed = ["remote_engine_id", "remote_host", "remote_port"]
            if "remote_request_id" in self.cfg.release.kv_transfer_params.produced:
                needed.append("remote_request_id")  # 0.11 pairs by the X-Request-Id both legs carry
            if params.get("remote_block_ids") and all(key in params for key in needed):
                return False, params
            log.warning("Got invalid KVTransferParams: %s. This request will not utilize KVTransfer", params)
        return False, None

    def _mooncake_role(self, params: dict[str, Any]) -> tuple[bool, dict[str, Any] | None]:
        """MooncakeConnectorScheduler's reading of kv_transfer_params (the router's transfer_id)."""
        if params.get("do_remote_prefill") and self.kv.is_consumer:
            if all(key in params for key in mooncake.CONSUMER_KEYS):
                return False, params
            log.warning("Got invalid KVTransferParams: %s. This request will not utilize KVTransfer", params)
        elif params.get("do_remote_decode") and self.kv.is_producer:
            if params.get(mooncake.PRODUCER_KEY):
                return True, None
            log.warning("Missing transfer_id in kv_transfer_params from router!")
        return False, None

    def hold_key(self, body: dict[str, Any], rid: str) -> str:
        """What a producer holds a request's blocks under for its consumer: Mooncake's transfer_id, 0.11
        NIXL's engine request id derived from X-Request-Id, else its own request id ("")."""
        params = body.get("kv_transfer_params")
        if self.mooncake:
            return str(params.get(mooncake.PRODUCER_KEY) or "") if isinstance(params, dict) else ""
        return f"{rid}-0" if self.pairs_by_request_id() else ""

    def pairs_by_request_id(self) -> bool:
        """vLLM 0.11: P returns no remote_request_id; D names P's request by the id both derive from
        the X-Request-Id header the proxy sends on both legs."""
        return "remote_request_id" not in self.cfg.release.kv_transfer_params.produced

    def params_out(self, req: SimRequest, finish_reason: str | None) -> dict[str, Any] | None:
        """What a producer returns for the decode side (NixlConnector's request_finished, per release):
        the release's keys only, only for the finish statuses it hands blocks over for; otherwise the
        held blocks are freed at once."""
        if not req.remote_decode:
            return None
        cfg, facts = self.cfg, self.cfg.release.kv_transfer_params
        key = req.kv_id or req.request_id
        if self.mooncake:  # request_finished returns no params; only a length-capped prefill is sent
            handed_over = FINISH_STATUS.get(finish_reason or "") == mooncake.HANDED_OVER
            if not handed_over and self.engine.release_held(key) is not None:
                self.wake()
            return None
        if FINISH_STATUS.get(finish_reason or "") not in facts.finish_statuses:
            if self.engine.release_held(key) is not None:
                self.wake()
            return None
        blocks = list(req.block_ids)
        values: dict[str, Any] = {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            # one list per KV-cache group where the release nests them (the simulated model has one group)
            "remote_block_ids": blocks if facts.block_ids_type == "list[int]" else [blocks],
            "remote_engine_id": self.kv.engine_id,
            "remote_request_id": key,
            "remote_host": cfg.side_channel_host,
            "remote_port": cfg.side_channel_port,
            "tp_size": cfg.tensor_parallel_size,
            "dcp_size": 1,
            "pp_size": 1,
            "remote_num_tokens": req.prompt_tokens,
            # set only for blocks a decode pins for a turn-2 readback (pull_scheduler.request_finished):
            # a prefill instance's hold is its lease, never announced here
            "remote_blocks_expiry_time": None,
            "remote_registration_generation": 0,
            "transfer_mode": "pull",
        }
        return {name: values[name] for name in facts.produced if name in values}

    # ---- producer ---------------------------------------------------------------------------------
    def grant(self, rid: str) -> ReadGrant | None:
        """Side channel: the size of a held request's KV, or None if unknown/expired."""
        req = self.engine.held_request(rid)
        if req is None:
            return None
        nbytes, blocks = req.prompt_tokens * self.cfg.kv_bytes_per_token, len(req.block_ids)
        offer = None if self.library is None else self.library.offer(rid, nbytes, blocks).to_wire()
        grant = ReadGrant(req.prompt_tokens, blocks, nbytes, offer)
        if self.mooncake:  # P pushes: it observes the transfer once the consumer reports it done
            self._granted[rid] = grant
        return grant

    def pushed(self, rid: str, xfer_s: float, moved: int | None = None) -> None:
        """Side channel (Mooncake's P): the transfer of a granted read took xfer_s simulated seconds (and
        moved `moved` bytes through the engine, with the library on). Mooncake pushes from P, so P's
        vllm:mooncake_* histograms observe it (mooncake/stats.py: the bytes the engine moved)."""
        grant = self._granted.pop(rid, None)
        if grant is not None and self.metrics.mooncake:
            nbytes = grant.nbytes if moved is None or self.library is None else moved
            self.metrics.mooncake_xfer.observe(xfer_s)
            self.metrics.mooncake_bytes.observe(nbytes)
            self.metrics.mooncake_descriptors.observe(grant.num_blocks)
            self._window.append(transfer_log.Transfer(xfer_s, 0.0, nbytes, grant.num_blocks))

    def release(self, rid: str) -> None:
        """Side channel: the consumer read the blocks; free them and maybe admit waiting work."""
        self._granted.pop(rid, None)
        if self.library is not None:  # the consumers' NIXL notifications, taken as vLLM's scheduler does
            asyncio.ensure_future(self.library.drain_notifications())
        if self.engine.release_held(rid) is not None:
            self.wake()
        else:
            self.metrics.nixl_after_expiry += 1

    def renew(self, rid: str) -> bool:
        """Side channel: a consumer's heartbeat extends the lease on a held request's blocks."""
        timing = self.cfg.release.lease_timing(self.cfg.abort_timeout_s)
        if timing is None:
            return False
        return self.engine.extend_held(rid, self.clock.now() + timing[2])

    async def keep_alive(self, req: SimRequest) -> None:
        """Consumer: while the request waits for its turn, renew the producer's lease every heartbeat
        interval (vLLM 0.33's decoder heartbeats); nothing on a release without leases."""
        timing = self.cfg.release.lease_timing(_lease_of(self.kv))
        params = req.remote_prefill
        if timing is None or params is None or self.mooncake:  # Mooncake holds for a fixed timeout
            return
        interval = max(timing[1], 1.0)
        while True:
            await self.clock.sleep(interval)
            if req.state is not State.WAITING or req.remote_prefill is None:
                return
            await heartbeat(params)

    def expire_leases(self, now: float) -> None:
        """Free producer blocks whose consumer never came, logging as vLLM does (once per step)."""
        for req in self.engine.expire_held(now):
            self._granted.pop(req.kv_id or req.request_id, None)
            if self.mooncake:
                self.metrics.mooncake_expired += 1
            else:
                self.metrics.nixl_expired += 1
            log.warning(
                "Releasing expired KV blocks for request %s which were retrieved by %d decode worker(s) "
                "within %d seconds.",
                req.request_id,
                0,
                int(self.cfg.abort_timeout_s),
            )

    # ---- consumer ---------------------------------------------------------------------------------
    async def load(self, req: SimRequest) -> None:
        """Pull the request's KV from its producer over the side channel, then let it decode."""
        params = req.remote_prefill or {}
        timing: dict[str, float] = {}
        moved: dict[str, int] = {}

        async def wait_transfer(grant: ReadGrant) -> float:
            if grant.num_tokens != req.prompt_tokens:
                # another prompt, or a count the producer never made: these blocks are not this KV
                raise PullError(
                    f"the producer holds KV for {grant.num_tokens} prompt tokens, this request has "
                    f"{req.prompt_tokens}",
                    handshake=False,
                )
            moved["blocks"], moved["bytes"] = missing(grant, req.cached[0], self.engine.limits.block_size)
            now = self.clock.now()
            end = self._link.reserve(now, moved["bytes"])
            # the modelled setup, not the real loopback handshake (which time scaling would inflate)
            timing["post"] = self.cfg.link.setup_s
            real = self._read_real(grant, moved["blocks"], str(params.get("remote_request_id")))
            await self.clock.sleep(end - now)
            if real is not None:  # the modelled wait is the clock; the real READ must have succeeded too
                try:
                    moved["bytes"] = await real
                except LibraryError as exc:
                    raise PullError(str(exc), handshake=exc.handshake) from exc
            timing["xfer"] = end - now
            return end - now

        ok = True
        try:
            if self.mooncake:
                params = await self._mooncake_source(params)
            real_bytes = (lambda: moved.get("bytes")) if self.library is not None else None
            grant, notified = await pull(
                params, self.compat, wait_transfer, self._receive_timeout_s(), real_bytes
            )
            m = self.metrics
            if not notified:
                m.nixl_failed_notifications += 1
                # 0.33 counts it in nixl_num_failed_transfers too (the table's counting rule)
                m.nixl_failed_transfers += int(m.notification_is_failed_transfer)
            m.nixl_xfer.observe(timing["xfer"])
            m.nixl_post.observe(timing["post"])
            m.nixl_bytes.observe(moved["bytes"])
            m.nixl_descriptors.observe(moved["blocks"])
            if not self.mooncake:  # Mooncake's P records its push (`pushed`)
                self._window.append(
                    transfer_log.Transfer(timing["xfer"], timing["post"], moved["bytes"], moved["blocks"])
                )
        except mooncake.BootstrapError as exc:
            ok = False
            self.metrics.mooncake_recvs += 1
            log.error("Mooncake transfer failed for request %s: %s", req.request_id, exc)
        except PullError as exc:
            ok = False
            if self.mooncake:
                self.metrics.mooncake_recvs += 1  # D detects it: a failed receive
                # vLLM 0.33's MooncakeConnectorWorker._handle_failed_recv
                log.error("pulling kv_caches for %s failed: %s", [req.request_id], exc)
            elif exc.handshake:
                self.metrics.nixl_failed_transfers += 1
                log.error(
                    "Handshake failed for request %s, marking blocks as invalid (%s)", req.request_id, exc
                )
            else:
                self.metrics.nixl_failed_transfers += 1
                log.error(
                    "NIXL transfer failed for request %s with state %s. Marking blocks as invalid.",
                    req.request_id,
                    exc,
                )
        if not ok and not self.cfg.release.handshake.reports_load_errors:
            # 0.11.0 has no way back: the worker raises on the missing agent or failed read (the engine
            # dies there; the simulator fails the request only), and nothing is recomputed
            log.error(
                "vLLM %s reports no KV load errors (no get_block_ids_with_load_errors): request %s "
                "cannot be recomputed",
                self.cfg.release.version,
                req.request_id,
            )
        failed = self.engine.kv_loaded(req.request_id, ok)
        if failed is not None:
            sink: Sink = failed.sink
            if "error" in self.metrics.success:  # FinishReason.ERROR: 0.33 on; 0.11 counts no reason for it
                self.metrics.success["error"] += 1
            sink.settle(f"KV transfer for request {failed.request_id} failed (kv_load_failure_policy=fail)")
        self.wake()

    def _read_real(self, grant: ReadGrant, blocks: int, notif: str) -> asyncio.Future[int] | None:
        """Consumer with the library: the real READ of the blocks it misses, beside the modelled wait
        (None without the library). A producer offering none cannot be read: a failed handshake."""
        if self.library is None:
            return None
        offer = Offer.from_wire(grant.library)
        if offer is None:
            raise PullError(
                f"the producer offers no {self.library.library} (kv_transfer.sim_library off there)", True
            )
        return asyncio.ensure_future(self.library.read(offer, blocks, notif))

    def _receive_timeout_s(self) -> float | None:
        """The release's handshake receive timeout in seconds (None: 0.11.0 waits without a bound)."""
        timeout_ms = self.cfg.release.handshake.receive_timeout_ms
        return None if timeout_ms is None else timeout_ms / 1000

    async def _mooncake_source(self, params: dict[str, Any]) -> dict[str, Any]:
        """Where to read a Mooncake request's KV: the producer's worker, from its bootstrap server."""
        where = str(params["remote_bootstrap_addr"])
        engines = await mooncake.query(where)
        host, port = mooncake.worker_endpoint(engines, str(params["remote_engine_id"]), where)
        return {
            "remote_host": host,
            "remote_port": port,
            "remote_engine_id": params["remote_engine_id"],
            "remote_request_id": params["transfer_id"],
        }

    # ---- periodic log line ------------------------------------------------------------------------
    def log_transfers(self) -> None:
        """vLLM's periodic `KV Transfer metrics: ...` line over the interval since the last one, with the
        keys the release's connector logs (nothing for an interval without transfers or failures)."""
        keys = self.cfg.release.transfer_log(self.kv.connector)
        counts = self._failure_counts()
        failed = {key: n - self._logged_failures.get(key, 0) for key, n in counts.items()}
        self._logged_failures = counts
        window, self._window = self._window, []
        text = transfer_log.line(keys.keys, window, failed) if keys is not None else None
        if text is not None:
            log.info("%s", text)

    def _failure_counts(self) -> dict[str, int]:
        """The failure counters behind the line's failure keys (cumulative), by key."""
        m = self.metrics
        if self.mooncake:
            failed = {"Num failed transfers": m.mooncake_failed, "Num failed recvs": m.mooncake_recvs}
            return {**failed, "Num KV expired reqs": m.mooncake_expired}
        return {
            "Num failed transfers": m.nixl_failed_transfers,
            "Num KV expired reqs": m.nixl_expired,
            "Num notifs after expiry": m.nixl_after_expiry,
        }

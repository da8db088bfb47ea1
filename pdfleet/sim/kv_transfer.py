"""One instance's side of P/D, as vLLM's NixlConnector plays it, over the simulated clock and link.

- kv_transfer_params in (which role a request takes here) and out (what a producer returns for the
  decode side);
- producer: finished prefills hold their blocks; the side channel gets read grants for them and frees
  them on the consumer's notification, or they expire when the lease runs out;
- consumer: a `remote_prefill` request pulls its KV from the producer, waiting the link's queued
  transfer time, then decodes (or fails / recomputes, per kv_load_failure_policy);
- vLLM's NIXL start-up lines, the nixl_* metrics and the periodic `KV Transfer metrics` line.

The wire protocol is `pdfleet.sim.side_channel`; the link's timing is `pdfleet.sim.perf.LinkQueue`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pdfleet.sim.clock import SimClock
from pdfleet.sim.config import KVTransfer, SimConfig
from pdfleet.sim.engine import Engine, SimRequest
from pdfleet.sim.metrics import SimMetrics
from pdfleet.sim.perf import LinkQueue
from pdfleet.sim.side_channel import PullError, ReadGrant, SideChannelServer, compat_hash, pull
from pdfleet.sim.stream import Sink

log = logging.getLogger("pdfleet.sim")


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
        self.compat = compat_hash(cfg.model_spec.name, cfg.kv_cache_dtype, cfg.block_size)
        self._side: SideChannelServer | None = None
        self._link = LinkQueue(cfg.link)
        self._window: list[tuple[float, float, int, int]] = []  # (xfer s, post s, bytes, descriptors)

    # ---- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        """Log vLLM's connector start-up lines; on a producer, listen on the side channel."""
        kv, cfg = self.kv, self.cfg
        log.info("Creating v1 connector with name: %s and engine_id: %s", kv.connector, kv.engine_id)
        log.info("Initializing NIXL Scheduler %s", kv.engine_id)
        log.info("Initializing NIXL wrapper")
        log.info("Initializing NIXL worker %s", kv.engine_id)
        if kv.is_producer:
            self._side = SideChannelServer(kv.engine_id, self.compat, self.grant, self.release)
            await self._side.start(cfg.side_channel_host, cfg.side_channel_port)
            log.info("KV side channel listening on %s:%d", cfg.side_channel_host, cfg.side_channel_port)

    async def close(self) -> None:
        """Close the side channel (if this is a producer)."""
        if self._side is not None:
            await self._side.close()

    # ---- kv_transfer_params -----------------------------------------------------------------------
    def role_of(self, body: dict[str, Any]) -> tuple[bool, dict[str, Any] | None]:
        """(remote_decode, remote_prefill params) from the request's kv_transfer_params and our kv_role."""
        params = body.get("kv_transfer_params")
        if not isinstance(params, dict):
            return False, None
        if params.get("do_remote_decode") and self.kv.is_producer:
            return True, None
        if params.get("do_remote_prefill") and self.kv.is_consumer:
            return False, params
        return False, None

    def params_out(self, req: SimRequest) -> dict[str, Any] | None:
        """What a producer returns for the decode side (vLLM NixlConnector request_finished)."""
        if not req.remote_decode:
            return None
        cfg = self.cfg
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": list(req.block_ids),
            "remote_engine_id": self.kv.engine_id,
            "remote_request_id": req.request_id,
            "remote_host": cfg.side_channel_host,
            "remote_port": cfg.side_channel_port,
            "tp_size": cfg.tensor_parallel_size,
        }

    # ---- producer ---------------------------------------------------------------------------------
    def grant(self, rid: str) -> ReadGrant | None:
        """Side channel: the size of a held request's KV, or None if unknown/expired."""
        req = self.engine.held_request(rid)
        if req is None:
            return None
        return ReadGrant(
            req.prompt_tokens, len(req.block_ids), req.prompt_tokens * self.cfg.kv_bytes_per_token
        )

    def release(self, rid: str) -> None:
        """Side channel: the consumer read the blocks; free them and maybe admit waiting work."""
        if self.engine.release_held(rid) is not None:
            self.wake()

    def expire_leases(self, now: float) -> None:
        """Free producer blocks whose consumer never came, logging as vLLM does (once per step)."""
        for req in self.engine.expire_held(now):
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

        async def wait_transfer(grant: ReadGrant) -> None:
            if grant.num_tokens != req.prompt_tokens:
                # another prompt, or a count the producer never made: these blocks are not this KV
                raise PullError(
                    f"the producer holds KV for {grant.num_tokens} prompt tokens, this request has "
                    f"{req.prompt_tokens}",
                    handshake=False,
                )
            now = self.clock.now()
            end = self._link.reserve(now, grant.nbytes)
            # the modelled setup, not the real loopback handshake (which time scaling would inflate)
            timing["post"] = self.cfg.link.setup_s
            await self.clock.sleep(end - now)
            timing["xfer"] = end - now

        ok = True
        try:
            grant, notified = await pull(params, self.compat, wait_transfer)
            m = self.metrics
            if not notified:
                m.nixl_failed_notifications += 1
            m.nixl_xfer.observe(timing["xfer"])
            m.nixl_post.observe(timing["post"])
            m.nixl_bytes.observe(grant.nbytes)
            m.nixl_descriptors.observe(grant.num_blocks)
            self._window.append((timing["xfer"], timing["post"], grant.nbytes, grant.num_blocks))
        except PullError as exc:
            ok = False
            self.metrics.nixl_failed_transfers += 1
            if exc.handshake:
                log.error(
                    "Handshake failed for request %s, marking blocks as invalid (%s)", req.request_id, exc
                )
            else:
                log.error(
                    "NIXL transfer failed for request %s with state %s. Marking blocks as invalid.",
                    req.request_id,
                    exc,
                )
        failed = self.engine.kv_loaded(req.request_id, ok)
        if failed is not None:
            sink: Sink = failed.sink
            self.metrics.success["error"] += 1
            sink.settle(f"KV transfer for request {failed.request_id} failed (kv_load_failure_policy=fail)")
        self.wake()

    # ---- periodic log line ------------------------------------------------------------------------
    def log_transfers(self) -> None:
        """vLLM's periodic `KV Transfer metrics: ...` line over the transfers since the last one (if any)."""
        if not self._window:
            return
        window, self._window = self._window, []
        xfers = sorted(w[0] for w in window)
        posts = sorted(w[1] for w in window)
        total_bytes = sum(w[2] for w in window)
        n = len(window)
        log.info(
            "KV Transfer metrics: Num successful transfers=%d, Avg xfer time (ms)=%.3f, P90 xfer time "
            "(ms)=%.3f, Avg post time (ms)=%.3f, P90 post time (ms)=%.3f, Avg MB per transfer=%.3f, "
            "Throughput (MB/s)=%.3f, Avg number of descriptors=%.1f",
            n,
            1e3 * sum(xfers) / n,
            1e3 * xfers[min(n - 1, int(0.9 * n))],
            1e3 * sum(posts) / n,
            1e3 * posts[min(n - 1, int(0.9 * n))],
            total_bytes / n / 1e6,
            total_bytes / 1e6 / max(sum(xfers), 1e-9),
            sum(w[3] for w in window) / n,
        )

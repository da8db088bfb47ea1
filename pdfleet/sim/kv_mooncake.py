"""The simulator's KV transfer through Mooncake's real transfer engine (issue 29), beside NIXL's
(`pdfleet.sim.kv_library`), for `MooncakeConnector` instances with `kv_transfer.sim_library` on.

With the library on, the kv_transfer role installs `mooncake-transfer-engine-non-cuda` (and Debian's
libibverbs1 and libnuma1, which its engine.so links even for TCP) beside the simulator and writes
`PDFLEET_SIM_KV_LIBRARY=mooncake` into `kv-transfer.env` with the Mooncake settings pdfleet renders
(`MC_TRANSFER_TIMEOUT`, `MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER`), which the engine reads from the
environment. Then, as vLLM 0.33's MooncakeConnector sets its engine up:

- every P/D instance creates a `TransferEngine` and `initialize(hostname, "P2PHANDSHAKE", "tcp", "")` (no
  etcd: the engine's own RPC port, `get_rpc_port()`, is its session `hostname:port`);
- a producer registers one DRAM buffer (`register_memory`, each 8-byte word holding its own offset) and its
  side channel's read grant carries its session and the region standing for the request's blocks
  (`kv_library.Offer`, sized by `kv_library.scaled`: the profile's fraction of each block's KV bytes);
- the consumer registers a buffer for the blocks it misses and `batch_transfer_sync_read`s them from the
  producer's session, one descriptor a block, then checks every word came from where it asked.

vLLM's prefill side writes (`batch_transfer_sync_write` to the decode's registered KV cache, after the
decode sent its block addresses over ZMQ); the simulator's decode side reads: the same engine, TCP
transport, handshake and bytes lab-p1 -> lab-d1, but the connections go decode -> prefill. The modelled
link stays the clock the bench reads. The engine reports a failure only as a negative return; its reason
is in its own log (glog, on stderr: the unit's journal), so the simulator keeps the engine's last error
lines (`StderrTail`) and a failed read names them.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pdfleet.sim.kv_library import (
    WORD,
    LibraryError,
    LibrarySettings,
    NixlAgent,
    Offer,
    mismatch,
    region_offset,
    scaled,
)

log = logging.getLogger("pdfleet.sim")

PROTOCOL = "tcp"  # kv_connector_extra_config.mooncake_protocol in the lab (no RDMA NICs)
METADATA = "P2PHANDSHAKE"  # no metadata server: peers exchange segment descriptors on the RPC port
GLOG_ERROR = re.compile(r"^E\d{4} ")  # glog's error lines: `E1203 17:45:17.957858 17464 file.cpp:1030] ...`
KEPT_LINES = 64
SETTLE_S, SETTLE_LIMIT_S = 0.05, 0.5  # a failure's reason: the pump catches up with the pipe first


def engine_errors(lines: list[str], since: int) -> str:
    """Mooncake's error lines logged at or after line number `since` (from `StderrTail.lines`), their
    text after glog's prefix, joined; '' when it logged none."""
    said = [
        line.split("] ", 1)[-1].strip() for n, line in lines_since(lines, since) if GLOG_ERROR.match(line)
    ]
    return "; ".join(dict.fromkeys(said))


def lines_since(lines: list[str], since: int) -> list[tuple[int, str]]:
    """(number, line) of the kept lines numbered at or after `since`; `lines` holds `NUMBER\\tTEXT`."""
    out = []
    for entry in lines:
        number, _, text = entry.partition("\t")
        if int(number) >= since:
            out.append((int(number), text))
    return out


class StderrTail:
    """This process's stderr (fd 2) passed through a pipe, its last lines kept: the engine's glog writes
    there from its own threads, and a failed call's reason is only in those lines."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: collections.deque[str] = collections.deque(maxlen=KEPT_LINES)
        self.count = 0  # lines seen so far
        read_end, write_end = os.pipe()
        self._out = os.dup(2)
        os.dup2(write_end, 2)
        os.close(write_end)
        self._thread = threading.Thread(target=self._pump, args=(read_end,), daemon=True, name="mc-log")
        self._thread.start()

    def _pump(self, fd: int) -> None:
        pending = b""
        while chunk := os.read(fd, 65536):
            os.write(self._out, chunk)
            pending += chunk
            *complete, pending = pending.split(b"\n")
            with self._lock:
                for line in complete:
                    self._kept.append(f"{self.count}\t{line.decode(errors='replace')}")
                    self.count += 1

    def mark(self) -> int:
        """The number the next line will get."""
        with self._lock:
            return self.count

    def lines(self) -> list[str]:
        """The kept lines, once the pump has taken what is in the pipe (no new line for SETTLE_S, at most
        SETTLE_LIMIT_S): the engine wrote its error lines before its call returned."""
        deadline, seen = time.monotonic() + SETTLE_LIMIT_S, -1
        while time.monotonic() < deadline and seen != self.mark():
            seen = self.mark()
            time.sleep(SETTLE_S)
        with self._lock:
            return list(self._kept)


_TAIL: StderrTail | None = None


def stderr_tail() -> StderrTail:
    """The process's one tail (made on the first engine)."""
    global _TAIL
    if _TAIL is None:
        _TAIL = StderrTail()
    return _TAIL


def _engine_class() -> Any:
    """Mooncake's TransferEngine as the kv_transfer role installs it (mooncake-transfer-engine-non-cuda)."""
    try:
        from mooncake.engine import TransferEngine  # the role's host library (pdfleet.hw.kv.SIM_MOONCAKE)
    except ImportError as exc:
        raise LibraryError(
            f"Mooncake's transfer engine is not importable here (kv_transfer.sim_library): {exc}", False
        ) from exc
    return TransferEngine


class MooncakeEngine:
    """One simulator's Mooncake transfer engine (P2PHANDSHAKE, tcp), every call on its own thread."""

    library = "Mooncake engine"  # what a producer without one does not offer

    def __init__(self, name: str, settings: LibrarySettings, hostname: str) -> None:
        self.name = name
        self.settings = settings
        self.hostname = hostname
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="mooncake")
        self._engine: Any = None
        self._buffer: Any = None  # the producer's registered buffer
        self.session = ""  # hostname:rpc_port, where peers reach this engine

    async def _call(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def start(self, producer: bool) -> None:
        """initialize the engine; a producer registers its buffer (each word its own offset)."""
        await self._call(self._create, producer)

    def _failed(self, what: str, rc: int, since: int) -> LibraryError:
        said = engine_errors(stderr_tail().lines(), since) or "nothing in its log"
        return LibraryError(f"{what} returned {rc}; Mooncake's log: {said}", False)

    def _create(self, producer: bool) -> None:
        import numpy as np

        engine_class = _engine_class()
        tail = stderr_tail()
        since = tail.mark()
        self._engine = engine_class()
        rc = self._engine.initialize(self.hostname, METADATA, PROTOCOL, "")
        if rc != 0:
            raise self._failed(
                f"TransferEngine.initialize({self.hostname!r}, {METADATA!r}, {PROTOCOL!r})", rc, since
            )
        self.session = f"{self.hostname}:{self._engine.get_rpc_port()}"
        if producer:
            self._buffer = np.arange(self.settings.buffer_bytes // WORD, dtype=np.uint64)
            rc = self._engine.register_memory(int(self._buffer.ctypes.data), int(self._buffer.nbytes))
            if rc != 0:
                raise self._failed("register_memory", rc, since)

    def offer(self, key: str, nbytes: int, num_blocks: int) -> Offer:
        """The region standing for a held request's blocks; the offer's metadata is the engine's session."""
        block_bytes = scaled(nbytes, num_blocks, self.settings.fraction, self.settings.buffer_bytes)
        offset = region_offset(key, block_bytes * num_blocks, self.settings.buffer_bytes)
        return Offer(self.session, int(self._buffer.ctypes.data), offset, block_bytes, num_blocks)

    async def read(self, offer: Offer, missing_blocks: int, notif: str) -> int:
        """Read the blocks the consumer misses from the producer's session; the bytes moved.
        LibraryError with Mooncake's logged reason on a negative return."""
        return int(await self._call(self._read, offer, missing_blocks))

    def _read(self, offer: Offer, missing_blocks: int) -> int:
        import numpy as np

        remote_offsets = offer.blocks_to_read(missing_blocks)
        if not remote_offsets:
            return 0
        size = offer.block_bytes
        local = np.zeros(len(remote_offsets) * size // WORD, dtype=np.uint64)
        addr = int(local.ctypes.data)
        engine, since = self._engine, stderr_tail().mark()
        rc = engine.register_memory(addr, int(local.nbytes))
        if rc != 0:
            raise self._failed("register_memory", rc, since)
        try:
            rc = engine.batch_transfer_sync_read(
                offer.metadata,
                [addr + i * size for i in range(len(remote_offsets))],
                [offer.base + o for o in remote_offsets],
                [size] * len(remote_offsets),
            )
        finally:
            engine.unregister_memory(addr)
        if rc != 0:
            raise self._failed(
                f"batch_transfer_sync_read of {len(remote_offsets)} blocks from {offer.metadata}", rc, since
            )
        wrong = mismatch(local, remote_offsets, size)
        if wrong is not None:
            raise LibraryError(wrong, False)
        return int(local.nbytes)

    async def drain_notifications(self) -> int:
        """Nothing to take: the side channel's `done` frees the blocks (vLLM's ZMQ reply does)."""
        return 0

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)


async def start_library(
    settings: LibrarySettings, connector_library: str, name: str, host: str, producer: bool
) -> NixlAgent | MooncakeEngine:
    """The connector's library started (`nixl` or `mooncake`); LibraryError when kv-transfer.env names
    another library than the connector's, or the library does not start."""
    if settings.library != connector_library:
        raise LibraryError(
            f"kv-transfer.env moves KV with {settings.library}, this connector with {connector_library}",
            False,
        )
    if connector_library == "mooncake":
        engine = MooncakeEngine(name, settings, host)
        await engine.start(producer)
        log.info(
            "KV bytes move through Mooncake's transfer engine (%s, %s at %s), %g of each request's KV bytes",
            PROTOCOL,
            METADATA,
            engine.session,
            settings.fraction,
        )
        return engine
    agent = NixlAgent(name, settings)
    await agent.start(producer)
    log.info("KV bytes move through NIXL (UCX), %g of each request's KV bytes", settings.fraction)
    return agent

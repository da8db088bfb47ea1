"""The simulator's KV transfer through the real library (issue 29): NIXL moves each P/D request's bytes.

With `kv_transfer.sim_library` on, the kv_transfer role installs NIXL's CPU build (nixl-cu12) beside the
simulator and writes `PDFLEET_SIM_KV_LIBRARY=nixl` and `PDFLEET_SIM_KV_BYTES_FRACTION` into
`kv-transfer.env`, which every instance's unit loads with the UCX settings pdfleet renders. Then:

- a producer creates a NIXL agent with the UCX backend and registers one DRAM buffer (`BUFFER_BYTES`),
  each 8-byte word holding its own offset; its side channel's read grant carries the agent's metadata,
  the buffer's address and the region standing for the request's KV blocks (`Offer`, sized by `scaled`:
  the model's per-token KV bytes times the fraction, per block);
- a consumer (vLLM's decode side pulls: NixlConnector READs) loads that metadata (`add_remote_agent`,
  once per producer agent, where UCX connects to the producer's data ports), READs the blocks it misses
  into a registered buffer of its own with the request id as notification, and checks every word came
  from where it was asked (`mismatch`).

The simulator's timing model stays the clock the bench reads: the real READ runs beside the modelled link
wait (`pdfleet.sim.kv_transfer`), and a failed one fails the request as vLLM's connector does (blocks marked
invalid, then recomputed or failed per kv_load_failure_policy). Every library call runs on one thread per
agent (the agent is created without locking, as vLLM's worker uses it from one thread); the library's own
log lines (`NIXL INFO ... Initialized NIXL agent`) go to the unit's log with the simulator's.

NIXL is imported only when the library is on: without it the simulator runs as before.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import threading
import zlib
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pdfleet.errors import ValidationError

LIBRARY_ENV = "PDFLEET_SIM_KV_LIBRARY"
FRACTION_ENV = "PDFLEET_SIM_KV_BYTES_FRACTION"
LIBRARIES = ("nixl", "mooncake")  # NixlConnector's, MooncakeConnector's (pdfleet.sim.kv_mooncake)
BUFFER_BYTES = 64 << 20  # a producer's registered buffer: every request's region lies in it
WORD = 8  # regions and blocks are whole 8-byte words (each word holds its own offset)
POLL_S = 0.001
# NIXL's progress thread waits on its UCX workers' event fds with poll() and this timeout (µs, rounded up to
# whole ms by the UCX backend); nixl_agent sets it to 0 (nixlAgentConfig.pthrDelay, NIXL 1.5.1's _api.py),
# and poll(..., 0) spins: ~0.45 of a core an agent, idle or not. 1 ms: woken by UCX's events, else 1000/s.
PROGRESS_DELAY_US = 1000
_CREATING = threading.Lock()  # nixl_agent's binding swapped while one agent is created
XFER_TIMEOUT_S = 30.0  # a READ still in progress after this fails (UCX_TCP_USER_TIMEOUT errs sooner)


class LibraryError(Exception):
    """The library refused or failed a step (its own words in the message)."""

    def __init__(self, message: str, handshake: bool) -> None:
        super().__init__(message)
        self.handshake = handshake


@dataclass(frozen=True)
class LibrarySettings:
    """What kv-transfer.env asks of the simulator's transfer library."""

    library: str
    fraction: float
    buffer_bytes: int = BUFFER_BYTES


def settings_from_env(env: Mapping[str, str]) -> LibrarySettings | None:
    """The library settings in the environment, None when it is off; ValidationError on bad values."""
    library = env.get(LIBRARY_ENV, "").strip()
    if not library:
        return None
    if library not in LIBRARIES:
        raise ValidationError(
            f"{LIBRARY_ENV}={library!r}: the simulator moves KV with {', '.join(LIBRARIES)}"
        )
    text = env.get(FRACTION_ENV, "")
    try:
        fraction = float(text)
    except ValueError:
        raise ValidationError(f"{FRACTION_ENV}={text!r}: want a number in (0, 1]") from None
    if not 0 < fraction <= 1:
        raise ValidationError(f"{FRACTION_ENV}={text!r}: want a number in (0, 1]")
    return LibrarySettings(library, fraction)


def scaled(nbytes: int, num_blocks: int, fraction: float, buffer_bytes: int) -> int:
    """Bytes per block the library moves for a request of `nbytes` KV in `num_blocks` blocks: the
    fraction of a block's bytes in whole words, at least one word, and all blocks within the buffer."""
    if num_blocks <= 0:
        return 0
    per_block = int(nbytes / num_blocks * fraction) // WORD * WORD
    fits = buffer_bytes // num_blocks // WORD * WORD
    return max(WORD, min(per_block, fits))


def region_offset(key: str, span: int, buffer_bytes: int) -> int:
    """Where a request's region starts in the producer's buffer (regions may overlap: it is read only)."""
    room = max(buffer_bytes - span, 0) // WORD
    return (zlib.crc32(key.encode()) % (room + 1)) * WORD


@dataclass(frozen=True)
class Offer:
    """A producer's grant of one request's blocks to READ (the side channel carries it as a dict)."""

    metadata: str  # the agent's metadata, base64 (vLLM's handshake carries NixlAgentMetadata)
    base: int  # the registered buffer's address
    offset: int  # the request's region in it
    block_bytes: int
    num_blocks: int

    def to_wire(self) -> dict[str, Any]:
        return {
            "metadata": self.metadata,
            "base": self.base,
            "offset": self.offset,
            "block_bytes": self.block_bytes,
            "num_blocks": self.num_blocks,
        }

    @staticmethod
    def from_wire(value: Any) -> Offer | None:
        """The offer in a read reply; None when the producer moves no bytes through a library."""
        if not isinstance(value, dict):
            return None
        try:
            return Offer(
                str(value["metadata"]),
                int(value["base"]),
                int(value["offset"]),
                int(value["block_bytes"]),
                int(value["num_blocks"]),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def blocks_to_read(self, missing_blocks: int) -> list[int]:
        """Remote offsets of the blocks a consumer reads: the last `missing_blocks` (past its cache hit)."""
        first = max(self.num_blocks - missing_blocks, 0)
        return [self.offset + i * self.block_bytes for i in range(first, self.num_blocks)]


def mismatch(words: Any, remote_offsets: list[int], block_bytes: int) -> str | None:
    """Why the bytes read are not the producer's at those offsets (each of its words holds its own
    offset), None when every word is right. `words` is the local buffer as numpy uint64s."""
    import numpy as np

    per_block = block_bytes // WORD
    for i, remote in enumerate(remote_offsets):
        want = np.arange(remote // WORD, remote // WORD + per_block, dtype=np.uint64)
        if not np.array_equal(words[i * per_block : (i + 1) * per_block], want):
            return f"block {i} (remote offset {remote}) holds other bytes than the producer's"
    return None


def _api() -> Any:
    """NIXL's Python API as the kv_transfer role installs it beside the simulator (nixl-cu12 alone)."""
    try:
        import nixl_cu12._api as api  # the role's host library (pdfleet.hw.kv.SIM_NIXL), not pip install .
    except ImportError as exc:
        raise LibraryError(f"NIXL is not importable here (kv_transfer.sim_library): {exc}", False) from exc
    return api


def quiet_agent(api: Any, name: str) -> Any:
    """`nixl_agent(name)` with the UCX backend, its progress thread waiting PROGRESS_DELAY_US at most for
    its workers' events instead of spinning: the agent config's pthrDelay, which nixl_agent's Python
    wrapper pins to 0 (no argument reaches it), set as the wrapper hands the config to the binding."""
    real = api.nixlBind.nixlAgent

    def with_delay(agent_name: str, config: Any) -> Any:
        config.pthrDelay = PROGRESS_DELAY_US
        return real(agent_name, config)

    with _CREATING:
        api.nixlBind.nixlAgent = with_delay
        try:
            return api.nixl_agent(name, api.nixl_agent_config(backends=["UCX"]))
        finally:
            api.nixlBind.nixlAgent = real


class NixlAgent:
    """One simulator's NIXL agent (UCX backend), every call on its own thread."""

    library = "NIXL agent"  # what a producer without one does not offer

    def __init__(self, name: str, settings: LibrarySettings) -> None:
        self.name = name
        self.settings = settings
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="nixl")
        self._agent: Any = None
        self._buffer: Any = None  # the producer's registered buffer
        self._metadata = ""
        self._remotes: dict[str, str] = {}  # the metadata's digest -> the remote agent's name

    async def _call(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def start(self, producer: bool) -> None:
        """Create the agent; a producer registers its buffer (each word its own offset)."""
        await self._call(self._create, producer)

    def _create(self, producer: bool) -> None:
        import numpy as np

        self._agent = quiet_agent(_api(), self.name)
        if producer:
            words = self.settings.buffer_bytes // WORD
            self._buffer = np.arange(words, dtype=np.uint64)
            region = (self._buffer.ctypes.data, self._buffer.nbytes, 0, "")
            self._agent.register_memory([region], "DRAM")
            self._metadata = base64.b64encode(self._agent.get_agent_metadata()).decode()

    def offer(self, key: str, nbytes: int, num_blocks: int) -> Offer:
        """The region standing for a held request's blocks (producer; pure but for the buffer's address)."""
        block_bytes = scaled(nbytes, num_blocks, self.settings.fraction, self.settings.buffer_bytes)
        offset = region_offset(key, block_bytes * num_blocks, self.settings.buffer_bytes)
        return Offer(self._metadata, int(self._buffer.ctypes.data), offset, block_bytes, num_blocks)

    async def read(self, offer: Offer, missing_blocks: int, notif: str) -> int:
        """READ the blocks the consumer misses from the producer's offer; the bytes moved.
        LibraryError (handshake when the remote agent could not be loaded) on any failure."""
        return int(await self._call(self._read, offer, missing_blocks, notif))

    def _remote(self, metadata: str) -> str:
        digest = hashlib.sha256(metadata.encode()).hexdigest()
        if digest not in self._remotes:
            try:
                name = self._agent.add_remote_agent(base64.b64decode(metadata))
            except Exception as exc:  # the library's own error is the finding
                raise LibraryError(f"add_remote_agent: {type(exc).__name__}: {exc}", True) from exc
            self._remotes[digest] = name.decode() if isinstance(name, bytes) else str(name)
        return self._remotes[digest]

    def _read(self, offer: Offer, missing_blocks: int, notif: str) -> int:
        import numpy as np

        remote_offsets = offer.blocks_to_read(missing_blocks)
        if not remote_offsets:
            return 0
        remote = self._remote(offer.metadata)
        size = offer.block_bytes
        local = np.zeros(len(remote_offsets) * size // WORD, dtype=np.uint64)
        addr = int(local.ctypes.data)
        agent = self._agent
        try:
            reg = agent.register_memory([(addr, local.nbytes, 0, "")], "DRAM")
        except Exception as exc:
            raise LibraryError(f"register_memory: {type(exc).__name__}: {exc}", False) from exc
        try:
            self._transfer(offer, remote, remote_offsets, addr, notif)
        finally:
            agent.deregister_memory(reg)
        wrong = mismatch(local, remote_offsets, size)
        if wrong is not None:
            raise LibraryError(wrong, False)
        return int(local.nbytes)

    def _transfer(self, offer: Offer, remote: str, remote_offsets: list[int], addr: int, notif: str) -> None:
        import time

        size = offer.block_bytes
        agent = self._agent
        try:
            local_descs = agent.get_xfer_descs(
                [(addr + i * size, size, 0) for i in range(len(remote_offsets))], "DRAM"
            )
            remote_descs = agent.get_xfer_descs([(offer.base + o, size, 0) for o in remote_offsets], "DRAM")
            handle = agent.initialize_xfer("READ", local_descs, remote_descs, remote, notif.encode())
        except Exception as exc:
            raise LibraryError(f"initialize_xfer: {type(exc).__name__}: {exc}", False) from exc
        try:
            state = agent.transfer(handle)
            deadline = time.monotonic() + XFER_TIMEOUT_S
            while state == "PROC" and time.monotonic() < deadline:
                time.sleep(POLL_S)
                state = agent.check_xfer_state(handle)
            if state != "DONE":
                raise LibraryError(
                    f"READ of {len(remote_offsets)} blocks from {remote}: state {state}", False
                )
        except LibraryError:
            raise
        except Exception as exc:
            raise LibraryError(f"READ: {type(exc).__name__}: {exc}", False) from exc
        finally:
            with contextlib.suppress(Exception):  # one still in progress cannot be freed: NIXL frees it later
                agent.release_xfer_handle(handle)

    async def drain_notifications(self) -> int:
        """Producer: take the consumers' notifications (the side channel's `done` frees the blocks)."""
        return int(await self._call(lambda: sum(len(m) for m in self._agent.get_new_notifs().values())))

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)

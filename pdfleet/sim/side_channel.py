"""The KV side channel's wire protocol between a producer and a consumer simulator (NIXL's handshake + READ).

Protocol: newline-delimited JSON over TCP, one connection per transfer, at the producer's
VLLM_NIXL_SIDE_CHANNEL_HOST:VLLM_NIXL_SIDE_CHANNEL_PORT (the `remote_host`/`remote_port` its
kv_transfer_params advertise):

  consumer → {"op": "read", "remote_request_id", "remote_engine_id", "remote_block_ids", "compat_hash"}
  producer → {"ok": true, "num_tokens", "num_blocks", "bytes"[, "library"]} | {"ok": false, "error"}
  ("library": the producer's NIXL or Mooncake offer when real bytes move, `pdfleet.sim.kv_library`)
  (consumer waits the link's transfer time for `bytes`: setup + bytes / (η · bandwidth), scaled)
  consumer → {"op": "done", "remote_request_id"[, "xfer_s", "bytes"]}  (NIXL's notification; the
  producer frees the blocks; Mooncake's P observes the transfer time and the bytes a library moved)
  producer → {"ok": true}

On a release with KV leases (vLLM 0.33), a consumer whose request still waits for its turn renews the
producer's lease on its own connection, every heartbeat interval:
  consumer → {"op": "heartbeat", "remote_request_id"}  producer → {"ok": held}

A failed `done` does not undo the read: the consumer keeps the KV and counts a failed notification
(vLLM's nixl_num_failed_notifications, apart from failed transfers); the producer's blocks stay held
until their lease expires.

Both ends live here (`SideChannelServer` on the producer, `pull` on the consumer); what an instance does
with them (holds, grants, metrics, the link's timing) is `pdfleet.sim.kv_transfer`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("pdfleet.sim.nixl")

HANDSHAKE_TIMEOUT_S = 5.0  # NIXL's handshake receive timeout [VLLM-PD §2.4]; wall seconds (a socket timeout)
MAX_LINE = 1 << 20


def compat_hash(model: str, kv_cache_dtype: str, block_size: int, vllm_version: str | None = None) -> str:
    """What must match between P and D for the KV layout to be readable (NIXL's compatibility hash),
    with the vLLM version where the release hashes it (0.33: P and D on different releases fail)."""
    text = f"pdfleet-sim/1|{model}|{kv_cache_dtype}|{block_size}"
    text += f"|{vllm_version}" if vllm_version else ""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ReadGrant:
    """The producer's answer to a read: how much KV the consumer has to move."""

    num_tokens: int
    num_blocks: int
    nbytes: int
    # the producer's NIXL offer (`pdfleet.sim.kv_library.Offer.to_wire`) when real bytes move
    library: dict[str, Any] | None = None


class SideChannelServer:
    """Producer side: answers reads for held requests and frees their blocks on `done`."""

    def __init__(
        self,
        engine_id: str,
        compat: str,
        grant: Callable[[str], ReadGrant | None],
        release: Callable[[str], None],
        renew: Callable[[str], bool] | None = None,
        pushed: Callable[[str, float, int | None], None] | None = None,
    ) -> None:
        self.engine_id = engine_id
        self._pushed = pushed  # Mooncake's P: the transfer time (and library bytes) `done` reports
        self.compat = compat
        self._grant = grant
        self._release = release
        self._renew = renew
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen for consumers on host:port (0: a free port); returns the port bound."""
        self._server = await asyncio.start_server(self._handle, host, port, limit=MAX_LINE)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        """Stop listening."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one consumer connection until it closes."""
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                msg = json.loads(line)
                reply = self._answer(msg)
                writer.write(json.dumps(reply).encode() + b"\n")
                await writer.drain()
        except (ConnectionError, json.JSONDecodeError, asyncio.IncompleteReadError, ValueError) as exc:
            log.warning("KV side channel: dropped a connection: %s", exc)
        finally:
            writer.close()

    def _answer(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The reply to one side-channel message (read or done)."""
        op = msg.get("op")
        rid = str(msg.get("remote_request_id"))
        if op == "read":
            if msg.get("compat_hash") != self.compat:
                return {"ok": False, "error": "NIXL compatibility hash mismatch", "compat_hash": self.compat}
            if msg.get("remote_engine_id") not in (None, self.engine_id):
                return {
                    "ok": False,
                    "error": f"remote engine id {msg.get('remote_engine_id')} is not this engine",
                }
            grant = self._grant(rid)
            if grant is None:
                return {
                    "ok": False,
                    "error": f"Potentially invalid KV blocks for unrecognized request {rid}. "
                    "They may have expired.",
                }
            reply = {
                "ok": True,
                "num_tokens": grant.num_tokens,
                "num_blocks": grant.num_blocks,
                "bytes": grant.nbytes,
                "compat_hash": self.compat,
            }
            return reply if grant.library is None else {**reply, "library": grant.library}
        if op == "done":
            if self._pushed is not None and isinstance(msg.get("xfer_s"), int | float):
                moved = msg.get("bytes")  # what a transfer library moved, when the consumer used one
                self._pushed(rid, float(msg["xfer_s"]), moved if isinstance(moved, int) else None)
            self._release(rid)
            return {"ok": True}
        if op == "heartbeat" and self._renew is not None:
            return {"ok": self._renew(rid)}
        return {"ok": False, "error": f"unknown op {op!r}"}


class PullError(Exception):
    """The KV could not be read from the producer (handshake, expired blocks, connection)."""

    def __init__(self, message: str, handshake: bool) -> None:
        super().__init__(message)
        self.handshake = handshake


async def pull(
    params: dict[str, Any],
    compat: str,
    wait_transfer: Callable[[ReadGrant], Awaitable[float | None]],
    timeout_s: float | None = HANDSHAKE_TIMEOUT_S,
    moved: Callable[[], int | None] | None = None,
) -> tuple[ReadGrant, bool]:
    """Consumer side: read the blocks named in kv_transfer_params, wait the transfer, notify the producer.

    `timeout_s` is the release's handshake receive timeout; None (0.11.0: no zmq.RCVTIMEO) waits for the
    producer without a bound, and a refused connection is retried every second as a zmq REQ socket
    reconnects. `moved` gives the bytes a transfer library moved, for the `done` message. Returns the grant
    and whether the producer acknowledged the notification.
    """
    host = params.get("remote_host")
    port = params.get("remote_port")
    if not host or not port:
        raise PullError("kv_transfer_params has no remote_host/remote_port", handshake=True)
    reader, writer = await _connect(str(host), port, timeout_s)
    try:
        grant = await _read(reader, writer, params, compat, f"{host}:{port}", timeout_s)
        xfer_s = await wait_transfer(grant)
        nbytes = moved() if moved is not None else None
        done = await _notify(reader, writer, params.get("remote_request_id"), timeout_s, xfer_s, nbytes)
        return grant, done
    finally:
        writer.close()


async def _connect(
    host: str, port: Any, timeout_s: float | None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """The side-channel connection; PullError (a handshake failure) once the timeout has passed."""
    while True:
        try:
            return await asyncio.wait_for(
                asyncio.open_connection(host, int(port), limit=MAX_LINE), timeout_s or HANDSHAKE_TIMEOUT_S
            )
        except (TimeoutError, OSError, ValueError) as exc:
            if timeout_s is not None or isinstance(exc, ValueError):
                raise PullError(
                    f"cannot reach the KV side channel at {host}:{port}: {exc}", handshake=True
                ) from exc
        await asyncio.sleep(1.0)  # no receive timeout: the REQ socket keeps reconnecting


async def _read(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    params: dict[str, Any],
    compat: str,
    where: str,
    timeout_s: float | None = HANDSHAKE_TIMEOUT_S,
) -> ReadGrant:
    """Ask the producer for the blocks in kv_transfer_params; PullError if it refuses or the channel fails."""
    msg = {
        "op": "read",
        "remote_request_id": params.get("remote_request_id"),
        "remote_engine_id": params.get("remote_engine_id"),
        "remote_block_ids": params.get("remote_block_ids"),
        "compat_hash": compat,
    }
    try:
        reply = await _ask(reader, writer, msg, timeout_s)
        if not reply.get("ok"):
            raise PullError(str(reply.get("error")), handshake="compatibility" in str(reply.get("error")))
        library = reply.get("library") if isinstance(reply.get("library"), dict) else None
        return ReadGrant(int(reply["num_tokens"]), int(reply["num_blocks"]), int(reply["bytes"]), library)
    except (TimeoutError, OSError, json.JSONDecodeError, KeyError) as exc:
        raise PullError(f"KV side channel {where} failed: {exc}", handshake=False) from exc


async def heartbeat(params: dict[str, Any]) -> bool:
    """Consumer side: renew the producer's lease on one request's blocks (False: gone or unreachable)."""
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(params["remote_host"], int(params["remote_port"]), limit=MAX_LINE),
            HANDSHAKE_TIMEOUT_S,
        )
    except (TimeoutError, OSError, ValueError, KeyError):
        return False
    try:
        msg = {"op": "heartbeat", "remote_request_id": params.get("remote_request_id")}
        reply = await _ask(reader, writer, msg)
        return bool(reply.get("ok"))
    except (TimeoutError, OSError, json.JSONDecodeError):
        return False
    finally:
        writer.close()


async def _notify(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    request_id: Any,
    timeout_s: float | None = HANDSHAKE_TIMEOUT_S,
    xfer_s: float | None = None,
    nbytes: int | None = None,
) -> bool:
    """Tell the producer the blocks were read (NIXL's notification, with the modelled transfer time a
    pushing producer observes); False if it did not acknowledge."""
    msg: dict[str, Any] = {"op": "done", "remote_request_id": request_id}
    if xfer_s is not None:
        msg["xfer_s"] = xfer_s
    if nbytes is not None:
        msg["bytes"] = nbytes
    try:
        await _ask(reader, writer, msg, timeout_s)
    except (TimeoutError, OSError, json.JSONDecodeError):
        return False
    return True


async def _ask(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    msg: dict[str, Any],
    timeout_s: float | None = HANDSHAKE_TIMEOUT_S,
) -> dict[str, Any]:
    """Send one message and wait (with the handshake timeout; None: without a bound) for its reply."""
    writer.write(json.dumps(msg).encode() + b"\n")
    await writer.drain()
    line = await asyncio.wait_for(reader.readline(), timeout_s)
    if not line:
        raise ConnectionError("side channel closed")
    result: dict[str, Any] = json.loads(line)
    return result

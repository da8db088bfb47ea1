"""ZeroMQ PUB and SUB sockets over asyncio (ZMTP 3.0, NULL security): what the gateway needs to read
vLLM's KV-cache events from the engines' PUB sockets, and the simulator to publish them, without a
ZeroMQ library on the hosts; and a ROUTER answering each DEALER or REQ peer's requests on its own
connection (the simulator's replay socket, as vLLM's publisher serves one at `replay_endpoint`).

The wire, as rfc.zeromq.org/spec/23 (ZMTP 3.0) has it: each side sends a 64-byte greeting (signature
0xFF, eight padding bytes, 0x7F; version 3.0; mechanism `NULL`; as-server 0), then a READY command with
its `Socket-Type`; then frames: a flags byte (0x01 more frames follow, 0x02 an 8-byte size, else one
byte; 0x04 a command) and the body. A SUB subscribes by sending a one-frame message of 0x01 followed by
the topic prefix (3.0's form, which libzmq's PUB accepts from a 3.0 peer; 0x00 cancels it; a 3.1 peer's
SUBSCRIBE and CANCEL commands are read too); the PUB then sends every message whose first frame starts
with one of the peer's prefixes, and drops a message for a peer whose unsent bytes are past its
high-water mark, as a PUB does. Only NULL security: the PUB endpoints are on the fleet's own
network, as vLLM binds them.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import Callable

SIGNATURE = b"\xff" + b"\x00" * 8 + b"\x7f"
GREETING = SIGNATURE + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00" + b"\x00" * 31
MORE, LONG, COMMAND = 0x01, 0x02, 0x04


class ZmtpError(ConnectionError):
    """The peer broke the protocol (or is not a ZMTP 3 NULL socket of the expected type)."""


def frame(body: bytes, flags: int = 0) -> bytes:
    """One frame: flags (LONG set when the body needs an 8-byte size) and size, then the body."""
    if len(body) > 255:
        return struct.pack(">BQ", flags | LONG, len(body)) + body
    return struct.pack(">BB", flags, len(body)) + body


def ready(socket_type: str) -> bytes:
    """The READY command announcing our socket type."""
    name, value = b"Socket-Type", socket_type.encode()
    body = b"\x05READY" + bytes([len(name)]) + name + struct.pack(">I", len(value)) + value
    return frame(body, COMMAND)


def parse_properties(body: bytes) -> dict[str, bytes]:
    """A READY command's properties (after its name)."""
    out: dict[str, bytes] = {}
    at = 0
    while at < len(body):
        n = body[at]
        name = body[at + 1 : at + 1 + n].decode("ascii", "replace")
        at += 1 + n
        if at + 4 > len(body):
            raise ZmtpError("READY property cut short")
        (size,) = struct.unpack_from(">I", body, at)
        out[name] = body[at + 4 : at + 4 + size]
        at += 4 + size
    return out


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """The next frame's flags and body."""
    head = await reader.readexactly(2)
    flags = head[0]
    if flags & LONG:
        (size,) = struct.unpack(">Q", head[1:] + await reader.readexactly(7))
    else:
        size = head[1]
    return flags, await reader.readexactly(size)


async def handshake(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ours: str, theirs: str
) -> None:
    """Greetings and READY commands both ways; the peer must be a ZMTP 3 NULL socket of type `theirs`."""
    await handshake_any(reader, writer, ours, (theirs,))


async def handshake_any(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ours: str, theirs: tuple[str, ...]
) -> str:
    """As `handshake`, the peer of any of the types `theirs`; its type."""
    writer.write(GREETING + ready(ours))
    await writer.drain()
    greeting = await reader.readexactly(64)
    if greeting[:1] != b"\xff" or greeting[9:10] != b"\x7f" or greeting[10] < 3:
        raise ZmtpError("not a ZMTP 3 peer")
    if greeting[12:32].rstrip(b"\x00") != b"NULL":
        raise ZmtpError(f"peer asks for security mechanism {greeting[12:32].rstrip(bytes(1))!r}, not NULL")
    flags, body = await read_frame(reader)
    if not flags & COMMAND or not body.startswith(b"\x05READY"):
        raise ZmtpError("peer sent no READY command")
    kind = parse_properties(body[6:]).get("Socket-Type", b"").decode("ascii", "replace")
    if kind not in theirs:
        raise ZmtpError(f"peer is a {kind or 'typeless'} socket, not {' or '.join(theirs)}")
    return kind


class Subscriber:
    """A SUB connected to one PUB endpoint (`host`, `port`), subscribed to a topic prefix."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def connect(cls, host: str, port: int, topic: bytes = b"", timeout_s: float = 5.0) -> Subscriber:
        """Connect, handshake and subscribe (within `timeout_s`)."""
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
        try:
            await asyncio.wait_for(handshake(reader, writer, "SUB", "PUB"), timeout_s)
            writer.write(frame(b"\x01" + topic))
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionResetError) as exc:
            writer.close()  # libzmq hangs up on a socket type it does not pair with
            what = f"{host}:{port} closed the connection in the handshake (not a ZMTP PUB?)"
            raise ZmtpError(what) from exc
        except BaseException:
            writer.close()
            raise
        return cls(reader, writer)

    async def receive(self) -> list[bytes]:
        """The next message's frames (commands the PUB sends, such as PING, are skipped)."""
        parts: list[bytes] = []
        while True:
            flags, body = await read_frame(self.reader)
            if flags & COMMAND:
                continue
            parts.append(body)
            if not flags & MORE:
                return parts

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()


class Publisher:
    """A PUB bound to (`host`, `port`): every connected SUB gets the messages its subscriptions match;
    a peer more than `hwm_bytes` behind misses messages (never blocks the publisher)."""

    def __init__(self, server: asyncio.Server, hwm_bytes: int) -> None:
        self.server = server
        self.hwm_bytes = hwm_bytes
        self.peers: dict[asyncio.StreamWriter, list[bytes]] = {}
        self.dropped = 0

    @classmethod
    async def bind(cls, host: str, port: int, hwm_bytes: int = 64 << 20) -> Publisher:
        pub: Publisher | None = None

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            assert pub is not None
            await pub._peer(reader, writer)

        server = await asyncio.start_server(serve, host or None, port)
        pub = cls(server, hwm_bytes)
        return pub

    @property
    def port(self) -> int:
        return int(self.server.sockets[0].getsockname()[1])

    async def _peer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Handshake with one SUB, then read its subscriptions until it leaves."""
        topics: list[bytes] = []
        try:
            await asyncio.wait_for(handshake(reader, writer, "PUB", "SUB"), 10)
            self.peers[writer] = topics
            while True:
                flags, body = await read_frame(reader)
                if flags & COMMAND:  # ZMTP 3.1: SUBSCRIBE / CANCEL commands
                    for name, on in ((b"\x09SUBSCRIBE", True), (b"\x06CANCEL", False)):
                        if body.startswith(name):
                            _subscribe(topics, body[len(name) :], on)
                elif body[:1] in (b"\x00", b"\x01"):
                    _subscribe(topics, body[1:], body[:1] == b"\x01")
        except (OSError, ZmtpError, asyncio.IncompleteReadError, TimeoutError):
            pass
        finally:
            self.peers.pop(writer, None)
            writer.close()

    def send(self, parts: list[bytes]) -> None:
        """Queue one message to every peer subscribed to its first frame (never waits)."""
        data = b"".join(frame(p, MORE if i < len(parts) - 1 else 0) for i, p in enumerate(parts))
        for writer, topics in self.peers.items():
            if not any(parts[0].startswith(t) for t in topics):
                continue
            if writer.transport.get_write_buffer_size() > self.hwm_bytes:
                self.dropped += 1
                continue
            writer.write(data)

    async def close(self) -> None:
        for writer in list(self.peers):
            writer.close()
        self.server.close()
        await self.server.wait_closed()


class Router:
    """A ROUTER bound to (`host`, `port`) that answers each request of a DEALER or REQ peer with the
    messages `answer(frames)` returns, on that peer's connection: a ROUTER's routing by identity comes
    down to that when every reply goes to the asker (the identity frame never crosses the wire)."""

    def __init__(self, server: asyncio.Server) -> None:
        self.server = server
        self.peers: set[asyncio.StreamWriter] = set()

    @classmethod
    async def bind(cls, host: str, port: int, answer: Callable[[list[bytes]], list[list[bytes]]]) -> Router:
        router: Router | None = None

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            assert router is not None
            router.peers.add(writer)
            try:
                await asyncio.wait_for(handshake_any(reader, writer, "ROUTER", ("DEALER", "REQ")), 10)
                while True:
                    for message in answer(await receive(reader)):
                        writer.write(
                            b"".join(
                                frame(p, MORE if i < len(message) - 1 else 0) for i, p in enumerate(message)
                            )
                        )
                    await writer.drain()
            except (OSError, ZmtpError, asyncio.IncompleteReadError, TimeoutError):
                pass
            finally:
                router.peers.discard(writer)
                writer.close()

        router = cls(await asyncio.start_server(serve, host or None, port))
        return router

    @property
    def port(self) -> int:
        return int(self.server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        for writer in list(self.peers):
            writer.close()
        self.server.close()
        await self.server.wait_closed()


class Dealer:
    """A DEALER connected to one ROUTER endpoint: messages out as they are, replies in (vLLM's replay)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def connect(cls, host: str, port: int, timeout_s: float = 5.0) -> Dealer:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
        try:
            await asyncio.wait_for(handshake(reader, writer, "DEALER", "ROUTER"), timeout_s)
        except (asyncio.IncompleteReadError, ConnectionResetError) as exc:
            writer.close()
            raise ZmtpError(f"{host}:{port} closed the connection in the handshake (not a ROUTER?)") from exc
        except BaseException:
            writer.close()
            raise
        return cls(reader, writer)

    async def send(self, parts: list[bytes]) -> None:
        self.writer.write(b"".join(frame(p, MORE if i < len(parts) - 1 else 0) for i, p in enumerate(parts)))
        await self.writer.drain()

    async def receive(self) -> list[bytes]:
        return await receive(self.reader)

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()


async def receive(reader: asyncio.StreamReader) -> list[bytes]:
    """The next message's frames (commands, such as PING, skipped)."""
    parts: list[bytes] = []
    while True:
        flags, body = await read_frame(reader)
        if flags & COMMAND:
            continue
        parts.append(body)
        if not flags & MORE:
            return parts


def _subscribe(topics: list[bytes], topic: bytes, on: bool) -> None:
    if on:
        topics.append(topic)
    elif topic in topics:
        topics.remove(topic)

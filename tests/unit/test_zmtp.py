"""The asyncio ZMTP SUB against libzmq's own PUB (pyzmq), as vLLM's ZmqEventPublisher binds it: the
subscription reaches it, messages of several frames and long frames arrive whole, only the subscribed
topic arrives; a peer that is not a PUB, or not ZMTP, is refused with a clear error."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator

import pytest
import zmq

from pdfleet.zmtp import GREETING, Publisher, Subscriber, ZmtpError, ready


@contextlib.contextmanager
def bound(kind: int) -> Iterator[tuple[zmq.Socket, int]]:
    ctx = zmq.Context()
    sock = ctx.socket(kind)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    try:
        yield sock, port
    finally:
        sock.close(linger=0)
        ctx.term()


async def _first(sub: Subscriber, pub: zmq.Socket, parts: list[bytes]) -> list[bytes]:
    """Publish until the subscription has reached the PUB (a PUB drops what no subscriber asked for)."""
    while True:
        pub.send_multipart(parts)
        try:
            return await asyncio.wait_for(sub.receive(), 0.05)
        except TimeoutError:
            continue


def test_a_subscriber_receives_libzmq_pub_messages_of_its_topic() -> None:
    async def scenario() -> None:
        with bound(zmq.PUB) as (pub, port):
            sub = await Subscriber.connect("127.0.0.1", port, b"kv")
            try:
                seq = (0).to_bytes(8, "big")
                assert await asyncio.wait_for(_first(sub, pub, [b"kv", seq, b"x"]), 10) == [b"kv", seq, b"x"]
                long = bytes(range(256)) * 300  # a frame past 255 bytes: the 8-byte size
                pub.send_multipart([b"other", b"skipped"])  # another topic: the PUB filters it
                pub.send_multipart([b"kv", (1).to_bytes(8, "big"), long])
                got = await asyncio.wait_for(sub.receive(), 5)
                while got[1] == seq:  # the first message may have gone out more than once
                    got = await asyncio.wait_for(sub.receive(), 5)
                assert got == [b"kv", (1).to_bytes(8, "big"), long]
            finally:
                await sub.close()

    asyncio.run(scenario())


def test_a_peer_of_another_socket_type_is_refused() -> None:
    """libzmq hangs up on a SUB it does not pair with; a ZMTP peer that answers names its type."""

    async def scenario() -> None:
        with bound(zmq.PUSH) as (_, port), pytest.raises(ZmtpError, match="closed the connection in the"):
            await Subscriber.connect("127.0.0.1", port)

        async def push(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(GREETING + ready("PUSH"))
            await writer.drain()
            await reader.read()
            writer.close()

        server = await asyncio.start_server(push, "127.0.0.1", 0)
        async with server:
            with pytest.raises(ZmtpError, match="peer is a PUSH socket, not PUB"):
                await Subscriber.connect("127.0.0.1", server.sockets[0].getsockname()[1])

    asyncio.run(scenario())


def test_a_peer_that_is_not_zmtp_is_refused() -> None:
    async def scenario() -> None:
        async def http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(b"HTTP/1.1 400 Bad Request\r\n\r\n" + b"x" * 64)
            await writer.drain()
            await reader.read()
            writer.close()

        server = await asyncio.start_server(http, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            with pytest.raises(ZmtpError, match="not a ZMTP 3 peer"):
                await Subscriber.connect("127.0.0.1", port)

    asyncio.run(scenario())


def test_nothing_listening_is_a_connection_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(OSError):
        asyncio.run(Subscriber.connect("127.0.0.1", port))


def test_a_libzmq_sub_receives_what_the_publisher_sends_on_its_topic() -> None:
    """The publisher against libzmq's SUB: the subscription (whichever form libzmq sends) arrives, a
    message of three frames (one past 255 bytes) arrives whole, another topic is filtered out."""

    async def scenario() -> None:
        pub = await Publisher.bind("127.0.0.1", 0)
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"kv")
        sub.connect(f"tcp://127.0.0.1:{pub.port}")
        try:
            while not any(pub.peers.values()):  # until the subscription arrived
                await asyncio.sleep(0.01)
            long = bytes(range(256)) * 300
            pub.send([b"other", b"x"])
            pub.send([b"kv", (7).to_bytes(8, "big"), long])
            await asyncio.sleep(0)
            got = await asyncio.get_running_loop().run_in_executor(None, lambda: sub.poll(5000))
            assert got and sub.recv_multipart() == [b"kv", (7).to_bytes(8, "big"), long]
            assert sub.poll(100) == 0  # the other topic never came
        finally:
            sub.close(linger=0)
            ctx.term()
            await pub.close()

    asyncio.run(scenario())


def test_the_publisher_and_the_subscriber_speak_to_each_other() -> None:
    async def scenario() -> None:
        pub = await Publisher.bind("127.0.0.1", 0)
        sub = await Subscriber.connect("127.0.0.1", pub.port, b"t")
        try:
            while not any(pub.peers.values()):
                await asyncio.sleep(0.01)
            pub.send([b"t", b"1"])
            assert await asyncio.wait_for(sub.receive(), 5) == [b"t", b"1"]
        finally:
            await sub.close()
            await pub.close()

    asyncio.run(scenario())

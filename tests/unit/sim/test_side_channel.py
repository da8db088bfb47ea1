"""The KV side channel's wire protocol: a consumer's read, the transfer wait, the notification, refusals."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from pdfleet.sim.side_channel import PullError, ReadGrant, SideChannelServer, compat_hash, pull


def _pull_from(handler: Any) -> tuple[tuple[ReadGrant, bool], list[int]]:
    """Run pull against an in-process producer on loopback; (result, bytes waited for)."""

    async def run() -> tuple[tuple[ReadGrant, bool], list[int]]:
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        moved: list[int] = []

        async def wait(grant: ReadGrant) -> None:
            moved.append(grant.nbytes)

        try:
            params = {"remote_host": "127.0.0.1", "remote_port": port, "remote_request_id": "r1"}
            return await pull(params, "compat", wait), moved
        finally:
            server.close()
            await server.wait_closed()

    return asyncio.run(run())


def test_side_channel_read_then_notification_frees_the_producer_blocks() -> None:
    released: list[str] = []
    side = SideChannelServer("engine-p", "compat", lambda rid: ReadGrant(10, 1, 1310720), released.append)
    (grant, notified), moved = _pull_from(side._handle)
    assert (grant.num_tokens, grant.nbytes, notified) == (10, 1310720, True)
    assert moved == [1310720] and released == ["r1"]


def test_a_lost_notification_keeps_the_kv_it_read() -> None:
    """The READ succeeded, so the consumer decodes; only the notification counts as failed."""

    async def producer_dies_after_read(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        grant = {"ok": True, "num_tokens": 10, "num_blocks": 1, "bytes": 1310720}
        writer.write(json.dumps(grant).encode() + b"\n")
        await writer.drain()
        writer.close()

    (grant, notified), moved = _pull_from(producer_dies_after_read)
    assert grant.nbytes == 1310720 and moved == [1310720]
    assert notified is False


def _producer(known: dict[str, ReadGrant]) -> SideChannelServer:
    return SideChannelServer("engine-p", "compat", known.get, lambda rid: None)


@pytest.mark.parametrize(
    ("msg", "error"),
    [
        ({"op": "read", "remote_request_id": "r1", "compat_hash": "other"}, "compatibility hash mismatch"),
        (
            {"op": "read", "remote_request_id": "r1", "compat_hash": "compat", "remote_engine_id": "x"},
            "remote engine id x is not this engine",
        ),
        ({"op": "read", "remote_request_id": "gone", "compat_hash": "compat"}, "They may have expired."),
        ({"op": "write", "remote_request_id": "r1"}, "unknown op 'write'"),
    ],
)
def test_the_producer_refuses_what_it_cannot_serve(msg: dict[str, Any], error: str) -> None:
    reply = _producer({"r1": ReadGrant(10, 1, 1310720)})._answer(msg)
    assert reply["ok"] is False and error in reply["error"]


def test_a_refused_read_is_a_pull_error_marked_as_handshake_only_for_compatibility() -> None:
    async def run(compat: str, rid: str) -> PullError:
        side = _producer({"r1": ReadGrant(10, 1, 1310720)})
        server = await asyncio.start_server(side._handle, "127.0.0.1", 0)
        params = {"remote_host": "127.0.0.1", "remote_port": server.sockets[0].getsockname()[1]}
        try:
            with pytest.raises(PullError) as exc:
                await pull({**params, "remote_request_id": rid}, compat, _no_wait)
            return exc.value
        finally:
            server.close()
            await server.wait_closed()

    assert asyncio.run(run("other", "r1")).handshake is True
    expired = asyncio.run(run("compat", "gone"))
    assert expired.handshake is False and "may have expired" in str(expired)


async def _no_wait(grant: ReadGrant) -> None:
    return None


def test_pull_without_a_remote_address_fails_the_handshake() -> None:
    with pytest.raises(PullError) as exc:
        asyncio.run(pull({"remote_request_id": "r1"}, "compat", _no_wait))
    assert exc.value.handshake is True and "no remote_host/remote_port" in str(exc.value)


def test_compat_hash_changes_with_what_makes_kv_unreadable() -> None:
    base = compat_hash("Llama-3.1-8B", "auto", 16)
    assert base == compat_hash("Llama-3.1-8B", "auto", 16)
    assert len({base, compat_hash("Llama-3.1-8B", "fp8", 16), compat_hash("Llama-3.1-8B", "auto", 32)}) == 3

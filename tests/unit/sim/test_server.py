"""The composed server in process: it binds, answers over HTTP with the runtime behind it, and stops."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import aiohttp
import pytest

from pdfleet.sim.config import parse_serve_args
from pdfleet.sim.server import SimServer, _tokenizer_file
from tests.unit.sim.helpers import MODEL, kv_config


def test_start_serve_and_stop_on_an_ephemeral_port(caplog: pytest.LogCaptureFixture) -> None:
    cfg = parse_serve_args([MODEL, "--sim-time-scale", "0.01", "--disable-log-stats"], env={})
    server = SimServer(cfg)

    async def run() -> tuple[int, dict[str, object], str]:
        await server.start("127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.bound_port()}"
        try:
            async with aiohttp.ClientSession() as http:
                async with http.get(url + "/health") as health:
                    status = health.status
                body = {"model": MODEL, "prompt": "hello", "max_tokens": 2}
                async with http.post(url + "/v1/completions", json=body) as resp:
                    out = await resp.json()
                async with http.get(url + "/metrics") as metrics:
                    text = await metrics.text()
        finally:
            await server.stop()
        return status, out, text

    with caplog.at_level(logging.INFO, logger="pdfleet.sim"):
        status, out, text = asyncio.run(run())
    assert status == 200
    assert out["usage"] == {
        "prompt_tokens": 2,
        "total_tokens": 4,
        "completion_tokens": 2,
        "prompt_tokens_details": None,
    }
    assert out["kv_transfer_params"] is None
    assert 'vllm:request_success_total{engine="0",finished_reason="length"' in text
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0].startswith("pdfleet-sim: simulating Llama-3.1-8B on 1x H100-SXM")
    assert messages[-1] == "Application startup complete."


def test_a_producer_opens_its_side_channel_after_vllms_lines(caplog: pytest.LogCaptureFixture) -> None:
    env = {"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": "0"}
    cfg = parse_serve_args([MODEL, "--kv-transfer-config", kv_config("kv_producer")], env=env)
    server = SimServer(cfg)

    async def run() -> None:
        await server.start("127.0.0.1", 0)
        await server.stop()

    with caplog.at_level(logging.INFO, logger="pdfleet.sim"):
        asyncio.run(run())
    messages = [r.getMessage() for r in caplog.records]
    assert messages[1].startswith("Creating v1 connector with name: NixlConnector and engine_id: ")
    assert "Initializing NIXL worker" in messages[4] and messages[5].startswith("KV side channel listening")


def test_the_tokenizer_file_is_found_in_a_directory_or_not_at_all(tmp_path: Path) -> None:
    assert _tokenizer_file(None) is None
    assert _tokenizer_file(str(tmp_path)) is None
    (tmp_path / "tokenizer.json").write_text("{}")
    assert _tokenizer_file(str(tmp_path)) == str(tmp_path / "tokenizer.json")
    assert _tokenizer_file(str(tmp_path / "tokenizer.json")) == str(tmp_path / "tokenizer.json")
    assert _tokenizer_file(str(tmp_path / "missing.json")) is None

"""The gateway-overhead targets, really started on loopback: each one streams; CPU counters are read."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from pdfleet.bench.client import Record, Stats, StreamClient, request_bytes
from pdfleet.bench.procs import stop_processes
from pdfleet.bench.proxies import PATH, Target, TlsFiles, find_nginx, start_targets
from pdfleet.bench.upstream import paced_body
from pdfleet.gateway.tls import client_context
from pdfleet.lab import pki

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py


def _stream_once(target: Target) -> Stats:
    async def main() -> Stats:
        request = request_bytes("127.0.0.1", target.port, PATH, paced_body(3, 1.0, 1.0), key=target.key)
        client = StreamClient("127.0.0.1", target.port, parse=False, tls=target.tls)
        await client.run(request, Record())
        client.close()
        return client.stats

    return asyncio.run(main())


def test_every_target_streams_the_upstreams_events(tmp_path: Path) -> None:
    """direct, nginx (when installed) and the gateway (with the bench key) deliver 3 events + [DONE]."""
    procs: list[subprocess.Popen] = []
    try:
        targets = start_targets(tmp_path, (None, None), procs)
        names = [t.name for t in targets]
        assert names == (["direct", "nginx", "gateway"] if find_nginx() else ["direct", "gateway"])
        for target in targets:
            stats = _stream_once(target)
            assert (target.name, stats.done, stats.events) == (target.name, 1, 4)
        every = sorted({pid for t in targets for pid in t.pids})
        assert all(t.bench == every for t in targets)
        counters = targets[-1].cpu_counters()
        assert set(counters) == {"proxy_cpu", "upstream_cpu", "client_cpu", "other_cpu"}
        assert counters["proxy_cpu"] >= 0 and counters["client_cpu"] > 0
    finally:
        stop_processes(procs)
    assert all(p.returncode is not None for p in procs)


def test_the_gateway_refuses_a_stream_without_the_key(tmp_path: Path) -> None:
    """The key written to keys.yaml is the one the gateway checks: no key, no stream."""
    procs: list[subprocess.Popen] = []
    try:
        gateway = start_targets(tmp_path, (None, None), procs)[-1]
        stats = _stream_once(Target("gateway", gateway.port, None, [], []))
        assert (stats.done, stats.failed) == (0, 1)
    finally:
        stop_processes(procs)


def test_with_tls_both_proxies_stream_in_https_verified_and_refuse_another_ca(tmp_path: Path) -> None:
    """--tls: nginx (when installed) and the gateway present the run's certificate; a client verifying it
    streams, one holding another CA fails on it; direct stays plain (the baseline)."""
    ca = pki.make_ca(tmp_path / "ca")
    pair = pki.issue(ca, tmp_path / "ca", "proxy", ["localhost"], ["127.0.0.1"])
    other = client_context(str(pki.make_ca(tmp_path / "other").cert))
    procs: list[subprocess.Popen] = []
    try:
        targets = start_targets(tmp_path, (None, None), procs, TlsFiles(pair.cert, pair.key, ca.cert))
        assert [t.tls is not None for t in targets] == [False] + [True] * (len(targets) - 1)
        for target in targets:
            stats = _stream_once(target)
            assert (target.name, stats.done, stats.events) == (target.name, 1, 4)
            if target.tls is not None:
                refused = _stream_once(Target(target.name, target.port, target.key, [], [], tls=other))
                assert (target.name, refused.done, refused.failed) == (target.name, 0, 1)
    finally:
        stop_processes(procs)

"""The KV path of each prefill->decode pair (`--kv-path`): the connector's library moves a DRAM buffer between
the two hosts' own processes (templates/kv_probe.py), judged by pdfleet.checks.kv_path."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from pdfleet.checks.kv_path import (
    PathFacts,
    ProbeSide,
    failure_message,
    fetch_command,
    parse_side,
    serve_command,
    verdict,
)
from pdfleet.checks.verify import VerifyPlugin, read_env
from pdfleet.fleet.host_layout import KV_ENV_FILE
from pdfleet.hw.kv import uses_rdma
from pdfleet.model.connectors import MOONCAKE, NIXL
from pdfleet.model.inventory import Host
from pdfleet.model.profile import Profile

SERVE_LOG = "/tmp/pdfleet-kv-probe-serve.log"


def _facts(
    verify: VerifyPlugin, profile: Profile, prefill: Host, decode: Host, env: dict[str, str]
) -> PathFacts:
    rdma = uses_rdma(profile, prefill) and uses_rdma(profile, decode)
    transport = "rdma" if rdma else "the same host" if prefill.name == decode.name else "tcp"
    return PathFacts(
        prefill=prefill.name,
        decode=decode.name,
        prefill_address=prefill.address,
        probe_port=profile.kv_transfer.probe_port,
        data_ports=env.get("UCX_TCP_PORT_RANGE"),
        floor_gbps=verify.profile.rdma.min_bandwidth_gbps if rdma else None,
        transport=transport,
    )


def _serve_side(server: Any, pid: str, wait: bool) -> ProbeSide:
    """The prefill side's output (once it printed its result, at most 3 s, when the decode side finished),
    then that process stopped by its pid and its log removed."""
    deadline = time.monotonic() + (3 if wait else 0)
    out = server.run(f"cat {SERVE_LOG}").stdout
    while '{"ok"' not in out and time.monotonic() < deadline:
        time.sleep(0.3)
        out = server.run(f"cat {SERVE_LOG}").stdout
    if pid.isdigit():
        server.run(f"kill {pid} 2>/dev/null; rm -f {SERVE_LOG}")
    return parse_side(out, 0)


def test_kv_path(
    verify: VerifyPlugin, kv_pair: tuple[Host, Host], record_property: Callable[..., None]
) -> None:
    prefill, decode = kv_pair
    profile = verify.kv_profile(prefill)
    library = {NIXL: "nixl", MOONCAKE: "mooncake"}.get(profile.kv_transfer.connector)
    if library is None:
        pytest.skip(
            f"the KV-path probe speaks NIXL and Mooncake; {profile.kv_transfer.connector} is not probed"
        )
    if profile.vllm.engine == "sim" and not profile.kv_transfer.sim_library:
        pytest.skip("engine: sim without kv_transfer.sim_library: the hosts have no transfer library")
    python = profile.vllm.venv.rstrip("/") + "/bin/python"
    server, client = verify.target_for(prefill), verify.target_for(decode)
    facts = replace(
        _facts(verify, profile, prefill, decode, read_env(server, KV_ENV_FILE) or {}), library=library
    )
    source, port = verify.options.kv_probe_source, facts.probe_port
    serving = serve_command(python, port, KV_ENV_FILE, SERVE_LOG, source, library, prefill.address)
    pid = server.run(serving).stdout.strip()
    fetching = fetch_command(python, prefill.address, port, KV_ENV_FILE, source, library, decode.address)
    fetched = client.run(fetching)
    fetch = parse_side(fetched.stdout + "\n" + fetched.stderr, fetched.rc)
    found = verdict(facts, _serve_side(server, pid, wait=fetch.result is not None), fetch)
    assert found.ok, failure_message(found)
    record_property("note", found.summary)

"""KV transfer checks: NIXL or Mooncake importable in the vLLM venv; the host-wide env file."""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from pdfleet.checks.verify import VerifyPlugin
from pdfleet.fleet.host_layout import KV_ENV_FILE
from pdfleet.hw.kv import kv_import_name
from pdfleet.model.inventory import Host


def kv_host(verify: VerifyPlugin, pd_host: Host) -> None:
    if not any(i.kv_role for i in verify.topology.on_host(pd_host.name)):
        pytest.skip("runs no prefill/decode pool")


def test_kv_library_importable(verify: VerifyPlugin, pd_host: Host, target: Any) -> None:
    kv_host(verify, pd_host)
    profile = verify.kv_profile(pd_host)  # the host's P/D model's connector
    if profile.vllm.engine == "sim" and not profile.kv_transfer.sim_library:
        pytest.skip("engine: sim: no NIXL/Mooncake wheel (the simulator models the transfer)")
    module = kv_import_name(profile)
    if module is None:
        pytest.skip(f"no transfer library known for {profile.kv_transfer.connector}")
    python = verify.profile.vllm.venv.rstrip("/") + "/bin/python"
    result = target.run(f"{shlex.quote(python)} -c {shlex.quote(f'import {module}')}")
    assert result.rc == 0, f"`import {module}` fails in {python}: {result.stderr.strip()[-300:]}"


def test_kv_env_file(verify: VerifyPlugin, pd_host: Host, target: Any) -> None:
    kv_host(verify, pd_host)
    f = target.file(KV_ENV_FILE)
    assert f.exists, f"{KV_ENV_FILE} is missing"
    assert f.mode == 0o600 and f.user == "root", f"{KV_ENV_FILE} is {oct(f.mode)} {f.user}, want 0600 root"
    assert "UCX_TLS=" in f.content_string, f"{KV_ENV_FILE} has no UCX_TLS"

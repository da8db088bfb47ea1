"""The controller's gateway client against a real gateway on loopback: it reports and sets the top-level
stage as before, and with a model that model group's stage only; a model the gateway lacks is an error
naming the gateway and its groups."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdfleet.errors import ValidationError
from pdfleet.gateway.app import Gateway, Running, start
from pdfleet.gateway.policy import load_policy
from pdfleet.lab import pki
from pdfleet.model.stages import StageSpec
from pdfleet.rollout.config import GatewayTarget
from pdfleet.rollout.gateways import GatewayClient, GatewayConflict, GatewayError
from tests.unit.gateway.helpers import ADMIN_KEY, LoopThread, policy_dict, write_policy

pytestmark = pytest.mark.procs  # openssl makes the CA and certificate of the TLS test

STAGES = {"off": StageSpec(short=0, long=0), "long-all": StageSpec(short=0, long=100)}


def test_the_client_targets_one_model_or_the_top_level(tmp_path: Path) -> None:
    colo, dis = ["http://127.0.0.1:9"], "http://127.0.0.1:10"  # never called: only the admin endpoints
    pol = policy_dict(colo, dis, groups={"big": {}, "small": {"stage": "off"}})
    pol["stages"] = {k: v.model_dump() for k, v in STAGES.items()}
    pol["models"] = {
        "big": {"colocated": colo, "disagg": dis, "group": "big"},
        "small": {"colocated": colo, "group": "small"},
    }
    path = write_policy(tmp_path, pol)
    loop = LoopThread()

    async def up() -> Running:
        return await start(Gateway(path, load_policy(path), shutdown_timeout=5))

    running: Running = loop.run(up)
    try:
        target = GatewayTarget(name="gw0", admin_url=f"http://127.0.0.1:{running.port}")
        client = GatewayClient(ADMIN_KEY)
        top, small = client.report(target), client.report(target, model="small")
        assert (top.version, top.stage, top.weights) == (1, "long-all", STAGES["long-all"])
        assert (small.stage, small.weights) == ("off", STAGES["off"])
        client.apply(target, 2, "long-all", STAGES, model="small")
        assert client.report(target, model="small").stage == "long-all"
        assert client.report(target, model="big").stage == "long-all"  # follows the top level
        client.apply(target, 3, "off", STAGES)
        after = (
            client.report(target).stage,
            client.report(target, "big").stage,
            client.report(target, "small"),
        )
        assert after[:2] == ("off", "off") and (after[2].version, after[2].stage) == (3, "long-all")
        with pytest.raises(GatewayConflict, match="gateway gw0"):
            client.apply(target, 3, "off", STAGES, model="small")
        with pytest.raises(GatewayError, match=r"no model group 'huge' \(groups: big, small\)"):
            client.report(target, model="huge")
        with pytest.raises(GatewayError, match="answered 404: model 'huge' is not a model group"):
            client.apply(target, 4, "off", STAGES, model="huge")
    finally:
        loop.run(running.close)
        loop.close()


def test_the_client_starts_reads_and_stops_a_shadow_run(tmp_path: Path) -> None:
    colo, dis = ["http://127.0.0.1:9"], "http://127.0.0.1:10"  # never called: only the admin endpoints
    path = write_policy(tmp_path, policy_dict(colo, dis))
    loop = LoopThread()

    async def up() -> Running:
        return await start(Gateway(path, load_policy(path), shutdown_timeout=5))

    running: Running = loop.run(up)
    try:
        target = GatewayTarget(name="gw0", admin_url=f"http://127.0.0.1:{running.port}")
        client = GatewayClient(ADMIN_KEY)
        assert client.shadow(target)["running"] is None
        started = client.shadow(target, {"action": "start", "stage": "long-all", "share": 20, "minutes": 1})
        assert (started["running"]["stage"], started["running"]["share"]) == ("long-all", 20)
        stopped = client.shadow(target, {"action": "stop"})
        assert stopped["running"] is None and stopped["last"]["ended"] == "stopped"
        with pytest.raises(GatewayError, match="gateway gw0: POST /admin/shadow answered 400: stage: 'x'"):
            client.shadow(target, {"action": "start", "stage": "x", "share": 20, "minutes": 1})
    finally:
        loop.run(running.close)
        loop.close()


def test_the_client_sets_a_stage_over_tls_verifying_the_gateways_ca(tmp_path: Path) -> None:
    """An https admin URL: the controller's client verifies the gateway against the CA it is given (a
    client given another CA, or none, gets a GatewayError naming the gateway, and changes nothing)."""
    ca = pki.make_ca(tmp_path / "ca")
    other = pki.make_ca(tmp_path / "other")
    pair = pki.issue(ca, tmp_path, "gateway", ["localhost"], ["127.0.0.1"])
    colo, dis = ["http://127.0.0.1:9"], "http://127.0.0.1:10"  # never called: only the admin endpoints
    listen = {"host": "127.0.0.1", "port": 0, "tls": {"cert_file": str(pair.cert), "key_file": str(pair.key)}}
    pol = policy_dict(colo, dis, listen=listen)
    pol["stages"] = {k: v.model_dump() for k, v in STAGES.items()}
    path = write_policy(tmp_path, pol)
    loop = LoopThread()

    async def up() -> Running:
        return await start(Gateway(path, load_policy(path), shutdown_timeout=5))

    running: Running = loop.run(up)
    try:
        target = GatewayTarget(name="gw0", admin_url=f"https://127.0.0.1:{running.port}")
        client = GatewayClient(ADMIN_KEY, ca_file=str(ca.cert))
        client.apply(target, 2, "off", STAGES)
        assert client.report(target).stage == "off"
        for wrong in (GatewayClient(ADMIN_KEY, ca_file=str(other.cert)), GatewayClient(ADMIN_KEY)):
            with pytest.raises(
                GatewayError, match=r"gateway gw0 \(https://.*\) is not answering: .*CERTIFICATE"
            ):
                wrong.apply(target, 3, "long-all", STAGES)
        assert client.report(target).stage == "off"
        with pytest.raises(ValidationError, match="cannot load the gateway's CA"):
            GatewayClient(ADMIN_KEY, ca_file=str(tmp_path / "missing.crt"))
    finally:
        loop.run(running.close)
        loop.close()

"""`POST /admin/stage` on a real gateway: the stage, version and stages are written into the policy file
(0600, the rest untouched), reloaded with no restart and reported in the header and /admin/policy; a retry
is a no-op; a version that does not rise, a bad body or a user key change nothing."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import yaml

from pdfleet.gateway.live import StageUpdate, is_noop, parse_update, rewritten
from pdfleet.gateway.policy import parse_policy
from tests.unit.gateway.helpers import ADMIN_KEY, LONG, Env, auth, chat, error_of, run

STAGES = {
    "off": {"short": 0, "long": 0},
    "long-all": {"short": 0, "long": 100},
    "long-all@0": {"short": 0, "long": 0},
}


def test_the_controller_sets_the_live_stage_and_the_gateway_reports_its_version(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Env(tmp_path) as env:
            before = yaml.safe_load(env.path.read_text())
            body = {"version": 2, "stage": "long-all@0", "stages": STAGES}
            status, _, raw = await env.post("/admin/stage", body, headers=auth(ADMIN_KEY))
            assert status == 200 and json.loads(raw) == {"ok": True, "version": 2, "stage": "long-all@0"}
            on_disk = yaml.safe_load(env.path.read_text())
            assert (on_disk["version"], on_disk["stage"], on_disk["stages"]) == (2, "long-all@0", STAGES)
            assert {k: v for k, v in on_disk.items() if k not in ("version", "stage", "stages")} == {
                k: v for k, v in before.items() if k not in ("version", "stage", "stages")
            }
            assert os.stat(env.path).st_mode & 0o777 == 0o600
            status, headers, _ = await env.post("/v1/chat/completions", chat(LONG))
            assert status == 200 and headers["X-Pdfleet-Policy-Version"] == "2"
            assert env.colo.seen and not env.dis.seen  # long-all@0 sends no long prompt to disagg
            async with env.session.get(env.base + "/admin/policy", headers=auth(ADMIN_KEY)) as r:
                info = await r.json()
            assert (info["version"], info["stage"]) == (2, "long-all@0")
            # a retry of the same update is a no-op; a lower or equal version with other content is refused
            assert (await env.post("/admin/stage", body, headers=auth(ADMIN_KEY)))[0] == 200
            stale = {"version": 2, "stage": "off", "stages": STAGES}
            status, _, raw = await env.post("/admin/stage", stale, headers=auth(ADMIN_KEY))
            assert status == 409 and "does not rise above the active version 2" in error_of(raw)["message"]
            assert yaml.safe_load(env.path.read_text())["stage"] == "long-all@0"

    run(scenario())


def test_bad_updates_change_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Env(tmp_path) as env:
            text = env.path.read_text()
            cases = [
                (auth(), {"version": 2, "stage": "off", "stages": STAGES}, 403, "admin key"),
                (auth(ADMIN_KEY), {"version": 2, "stage": "nope", "stages": STAGES}, 400, "not in stages"),
                (
                    auth(ADMIN_KEY),
                    {"version": 2, "stage": "off", "stages": {"off": {"short": 0, "long": 101}}},
                    400,
                    "stages.off.long",
                ),
                (auth(ADMIN_KEY), [1, 2], 400, "JSON object"),
                (auth(ADMIN_KEY), {"version": 2, "stage": "off", "stages": STAGES, "x": 1}, 400, "x"),
            ]
            for headers, body, status, fragment in cases:
                got, _, raw = await env.post("/admin/stage", body, headers=headers)
                assert got == status and fragment in error_of(raw)["message"], (body, raw)
            got, _, raw = await env.post("/admin/stage", None, headers=auth(ADMIN_KEY), raw=b"{not json")
            assert got == 400 and "not valid JSON" in error_of(raw)["message"]
            assert env.path.read_text() == text

    run(scenario())


def test_a_body_too_big_too_deep_badly_compressed_or_too_slow_is_a_4xx(tmp_path: Path) -> None:
    """N8: these were 500s (aiohttp's 413 raised through request.json(), a RecursionError, a bad gzip),
    and a body that never ended was waited for without a deadline."""

    async def scenario() -> None:
        async with Env(tmp_path, clients={"body_timeout_s": 0.5}) as env:
            text = env.path.read_text()
            admin = auth(ADMIN_KEY)
            big = json.dumps({"version": 2, "stage": "off", "stages": STAGES, "pad": "x" * (1 << 20)})
            got, _, raw = await env.post("/admin/stage", None, headers=admin, raw=big.encode())
            assert got == 413 and error_of(raw)["code"] == "request_too_large"
            deep = b"[" * 1025 + b"]" * 1025
            for nested in (deep, b'{"version": 2, "stage": ' + deep + b"}"):
                got, _, raw = await env.post("/admin/stage", None, headers=admin, raw=nested)
                assert got == 400, raw
            gz = {**admin, "Content-Encoding": "gzip"}
            got, _, raw = await env.post("/admin/stage", None, headers=gz, raw=b"\x1f\x8b\x08\x00garbage")
            assert got == 400 and error_of(raw)["message"], raw
            reader, writer = await asyncio.open_connection("127.0.0.1", env.gw.port)  # type: ignore[union-attr]
            writer.write(
                b"POST /admin/stage HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\n"
                b'Content-Length: 500\r\n\r\n{"version": ' % ADMIN_KEY.encode()
            )
            got_raw = await asyncio.wait_for(reader.read(), 5)  # answered and closed: the body never ends
            writer.close()
            assert got_raw.startswith(b"HTTP/1.1 408")
            assert env.path.read_text() == text
            assert await env.metric("pdfleet_gateway_requests_total", status="500") == 0

    run(scenario())


def test_rewritten_changes_three_keys_and_validates(tmp_path: Path) -> None:
    source = tmp_path / "policy.yaml"
    text = (
        "version: 1\nkeys_file: k.yaml\nmodels: {m: {colocated: ['http://127.0.0.1:1']}}\n"
        "stage: off\nstages: {off: {short: 0, long: 0}}\n"
    )
    update = parse_update({"version": 5, "stage": "half", "stages": {"half": {"short": 50, "long": 50}}})
    spec = parse_policy(source, rewritten(source, text, update))
    assert (spec.version, spec.stage, spec.stages["half"].short, spec.keys_file) == (5, "half", 50, "k.yaml")
    assert is_noop(spec, update) and not is_noop(
        spec, StageUpdate(version=6, stage="half", stages=update.stages)
    )


def _two_models(colo: str, dis: str) -> dict[str, Any]:
    """Aliases big (P/D, group big) and small (group small), both with a disagg pool."""
    return {
        "big": {"colocated": [colo], "disagg": dis, "group": "big"},
        "small": {"colocated": [colo], "disagg": dis, "group": "small"},
    }


def test_two_models_route_and_roll_out_independently(tmp_path: Path) -> None:
    groups = {"big": {}, "small": {"stage": "off"}}

    async def pool_of(env: Env, alias: str) -> str:
        status, headers, _ = await env.post(
            "/v1/chat/completions", {**chat(LONG, stream=True), "model": alias}
        )
        assert status == 200
        return str(headers["X-Pdfleet-Pool"])

    async def scenario() -> None:
        async with Env(tmp_path, models=_two_models, groups=groups, stages=STAGES) as env:
            assert (await pool_of(env, "big"), await pool_of(env, "small")) == ("disagg", "colocated")
            before = yaml.safe_load(env.path.read_text())
            body = {"version": 2, "stage": "long-all", "stages": STAGES, "model": "small"}
            status, _, raw = await env.post("/admin/stage", body, headers=auth(ADMIN_KEY))
            assert status == 200 and json.loads(raw) == {
                "ok": True,
                "version": 2,
                "stage": "long-all",
                "model": "small",
            }
            after = yaml.safe_load(env.path.read_text())
            assert after["groups"]["small"] == {"stage": "long-all", "stages": STAGES}
            assert after["groups"]["big"] == before["groups"]["big"] == {}
            assert (after["stage"], after["stages"]) == (before["stage"], before["stages"])
            assert (await pool_of(env, "big"), await pool_of(env, "small")) == ("disagg", "disagg")
            # the top level moves only the groups that follow it: big, not small (its own stage now)
            top = {"version": 3, "stage": "off", "stages": STAGES}
            assert (await env.post("/admin/stage", top, headers=auth(ADMIN_KEY)))[0] == 200
            assert (await pool_of(env, "big"), await pool_of(env, "small")) == ("colocated", "disagg")
            async with env.session.get(env.base + "/admin/policy", headers=auth(ADMIN_KEY)) as r:
                info = await r.json()
            assert (info["stage"], info["groups"]["small"]["stage"], info["groups"]["big"]["stage"]) == (
                "off",
                "long-all",
                "off",
            )
            assert info["groups"]["small"]["decisions"]["long"]["disagg"] == 1  # since the last reload
            assert info["groups"]["big"]["decisions"]["long"] == {"colocated": 1, "disagg": 0, "outside": 0}
            # the metrics name the model, so one model's rollout gate reads its own figures
            ttft = "pdfleet_gateway_ttft_seconds_count"
            assert await env.metric(ttft, model="small", pool="disagg", length_class="long") == 2
            assert await env.metric(ttft, model="big", pool="colocated") == 1
            decided = "pdfleet_gateway_routing_decisions_total"
            assert await env.metric(decided, model="small", stage="long-all", pool="disagg") == 2
            # a retry is a no-op; an unknown model is refused and changes nothing
            assert (await env.post("/admin/stage", {**body, "version": 3}, headers=auth(ADMIN_KEY)))[0] == 200
            text = env.path.read_text()
            status, _, raw = await env.post(
                "/admin/stage", {**body, "version": 9, "model": "huge"}, headers=auth(ADMIN_KEY)
            )
            assert status == 404 and "'huge' is not a model group" in error_of(raw)["message"]
            assert "groups: big, small" in error_of(raw)["message"] and env.path.read_text() == text

    run(scenario())


def test_a_model_update_on_a_policy_without_groups_is_refused(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Env(tmp_path) as env:
            body = {"version": 2, "stage": "off", "stages": STAGES, "model": "llama"}
            status, _, raw = await env.post("/admin/stage", body, headers=auth(ADMIN_KEY))
            assert status == 404 and "this policy has no groups" in error_of(raw)["message"]

    run(scenario())

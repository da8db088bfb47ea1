"""Policy file validation and the routing decision; what the real vllm-router does with /v1/messages."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from pdfleet.bench.launch import RouterProcess
from pdfleet.errors import ValidationError
from pdfleet.gateway.policy import (
    ROUTER_PD_ENDPOINTS,
    StageSpec,
    bucket_of,
    length_class,
    load_policy,
    parse_policy,
    policy_text,
    restart_only_changes,
    with_stage,
    write_policy,
)
from pdfleet.tokens import HFTokenizer
from tests.unit.gateway.helpers import (
    COLO,
    DIS,
    LoopThread,
    load_test_policy,
    policy_dict,
    policy_error,
)
from tests.unit.gateway.helpers import write_policy as write_test_policy

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py


def test_valid_policy_loads_with_defaults(tmp_path: Path) -> None:
    p = load_test_policy(tmp_path)
    assert p.spec.version == 1
    assert p.stage == StageSpec(short=0, long=100)
    assert p.routes["llama"].colocated == ("http://127.0.0.1:8001",)
    assert p.spec.stall_threshold_ms == 500
    assert len(p.keys) == 2
    assert len(p.sha256) == 64
    # a policy rendered without a clients section still bounds its clients
    c = p.spec.clients
    assert (c.header_timeout_s, c.body_timeout_s, c.idle_timeout_s) == (10, 60, 75)
    assert c.max_connections_per_address == 4096


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda p: p["models"]["llama"].update(colocatd=["x"]), "models.llama.colocatd: unknown key"),
        (lambda p: p.update(tagline="x"), "tagline: unknown key"),
        (lambda p: p.pop("version"), "version: required key is missing"),
        (
            lambda p: p["stages"]["half"].update(long=101),
            "stages.half.long: must be <= 100 (got 101)",
        ),
        (lambda p: p.update(stage="nope"), "stage: 'nope' is not a stage; stages are: off, long-all, half"),
        (
            lambda p: p["models"]["llama"].update(colocated=["http://h:1/v1"]),
            "models.llama.colocated[0]: 'http://h:1/v1' has a path; give the server root",
        ),
        (
            lambda p: p["models"]["llama"].update(disagg="ftp://h"),
            "models.llama.disagg: 'ftp://h' is not an http(s) URL with a host",
        ),
        (
            lambda p: p["models"]["llama"].update(colocated=[]),
            "models.llama.colocated: give at least one colocated base URL",
        ),
        (
            lambda p: p.update(long_prompt_tokens=0),
            "long_prompt_tokens: must be >= 1 (got 0)",
        ),
        (lambda p: p.update(listen={"port": 8080, "admin_port": 8080}), "listen.admin_port: must differ"),
        (lambda p: p.update(clients={"idle_timeout_s": 0}), "clients.idle_timeout_s: must be > 0.0 (got 0)"),
        (
            lambda p: p.update(clients={"max_connections_per_address": 0}),
            "clients.max_connections_per_address: must be >= 1 (got 0)",
        ),
        (lambda p: p.update(clients={"header_s": 5}), "clients.header_s: unknown key"),
        (
            lambda p: p["models"]["llama"].update(disagg_endpoints=["chat", "embeddings"]),
            "models.llama.disagg_endpoints[1]: must be one of 'chat', 'completions' or 'messages' (got",
        ),
        (
            lambda p: p.update(limits={"default": {"requests_per_second": 0}}),
            "limits.default.requests_per_second: must be >= 0.001 (got 0)",
        ),
        (lambda p: p.update(limits={"keys": {"user": {"rps": 1}}}), "limits.keys.user.rps: unknown key"),
        (
            lambda p: p.update(limits={"keys": {"nobody": {"burst": 2}}}),
            "limits.keys.nobody: no key of that name in the keys file (names: admin, user)",
        ),
        (
            lambda p: p.update(limits={"models": {"gpt": {"max_prompt_tokens": 2}}}),
            "limits.models.gpt: not a model alias (aliases: llama)",
        ),
        (
            lambda p: (
                p["estimator"].update(tokenizer="missing.json")
                if "estimator" in p
                else p.update(estimator={"tokenizer": "missing.json"})
            ),
            "estimator.tokenizer: ",
        ),
    ],
)
def test_policy_errors_name_file_and_key_path(tmp_path: Path, change, expected: str) -> None:
    pol = policy_dict(COLO, DIS)
    change(pol)
    msg = policy_error(tmp_path, pol)
    assert str(tmp_path / "policy.yaml") in msg
    assert expected in msg


def test_policy_not_yaml_mapping(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("- just\n- a list\n")
    with pytest.raises(ValidationError, match="must be a YAML mapping"):
        load_policy(path)
    path.write_text("version: [1\n")
    with pytest.raises(ValidationError, match="invalid YAML"):
        load_policy(path)


def test_base_url_path_rejected_with_hint(tmp_path: Path) -> None:
    pol = policy_dict(["http://10.0.0.1:8000/v1"], DIS)
    assert "give the server root" in policy_error(tmp_path, pol)


def test_length_class_threshold() -> None:
    assert length_class(999, 1000) == "short"
    assert length_class(1000, 1000) == "long"


def test_bucket_is_stable_and_in_range() -> None:
    assert bucket_of("s:abc") == bucket_of("s:abc")
    assert {bucket_of(f"k{i}") for i in range(5000)} == set(range(100))


def test_restart_only_changes(tmp_path: Path) -> None:
    a = load_test_policy(tmp_path).spec
    b = a.model_copy(update={"listen": a.listen.model_copy(update={"port": 9999})})
    assert restart_only_changes(a, a) == []
    assert "listen.port changed from 0 to 9999" in restart_only_changes(a, b)[0]


def test_tokenizer_estimator_counts_with_the_model_tokenizer(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "hello": 1, "world": 2}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    p = load_test_policy(tmp_path, estimator={"tokenizer": "tokenizer.json"})
    assert isinstance(p.counter, HFTokenizer)
    # 4 words -> 4 tokens by the tokenizer; the chars estimate would say ceil(23/4) = 6
    assert p.counter.count("hello world hello world") == 4


def test_the_real_vllm_router_forwards_messages_in_pd_mode_with_kv_transfer_params() -> None:
    """Why `disagg_endpoints` is the policy's to say: vllm-router (P/D mode) does carry /v1/messages, a
    prefill leg (max_tokens 1, do_remote_decode) then a decode leg with the prefill's kv_transfer_params;
    a P/D split needs vLLM's Messages route to honour them (vLLM PR #37535), which the router cannot see."""
    seen: list[tuple[str, str, dict]] = []
    ROLE = web.AppKey("role", str)  # noqa: N806
    remote = {
        "do_remote_prefill": True,
        "remote_engine_id": "e",
        "remote_block_ids": [1],
        "remote_host": "127.0.0.1",
        "remote_port": 1,
    }

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.method != "POST":
            return web.Response(text="ok")
        seen.append((request.app[ROLE], request.path, await request.json()))
        return web.json_response(
            {
                "id": "msg-1",
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": "m",
                "kv_transfer_params": remote,
            }
        )

    async def serve(role: str) -> tuple[web.AppRunner, str]:
        app = web.Application()
        app[ROLE] = role
        app.router.add_route("*", "/{tail:.*}", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"

    loop = LoopThread()
    (p_runner, p_url), (d_runner, d_url) = (
        loop.run(lambda: serve("prefill")),
        loop.run(lambda: serve("decode")),
    )
    try:
        with RouterProcess([p_url], [d_url]) as router:
            body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
            req = urllib.request.Request(
                router.url + "/v1/messages",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=30) as resp:
                assert resp.status == 200
    finally:
        loop.run(p_runner.cleanup)
        loop.run(d_runner.cleanup)
        loop.close()
    assert [(role, path) for role, path, _ in seen] == [
        ("prefill", "/v1/messages"),
        ("decode", "/v1/messages"),
    ]
    prefill, decode = seen[0][2], seen[1][2]
    assert prefill["max_tokens"] == 1 and prefill["kv_transfer_params"]["do_remote_decode"] is True
    assert decode["max_tokens"] == 5 and decode["kv_transfer_params"] == remote
    assert "messages" not in ROUTER_PD_ENDPOINTS  # so by default the gateway keeps them colocated


def test_policy_files_are_written_only_once_checked(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    doc = policy_dict(COLO, DIS, stage="off")
    text = policy_text(doc, path, "Managed by a test.\nSecond line.")
    assert text.startswith("# Managed by a test.\n# Second line.\n")
    assert parse_policy(path, text).stage == "off"  # YAML would read a bare off as false: dumped quoted
    write_policy(path, text)
    assert path.read_text() == text and path.stat().st_mode & 0o777 == 0o600
    with pytest.raises(ValidationError, match="stage: 'nope' is not a stage"):
        policy_text({**doc, "stage": "nope"}, path)
    with pytest.raises(ValidationError, match="bogus"):
        write_policy(path, text + "bogus: 1\n")
    assert path.read_text() == text and [p.name for p in tmp_path.iterdir()] == ["policy.yaml"]


def test_with_stage_changes_three_keys_and_keeps_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    text = policy_text(policy_dict(COLO, DIS, log_requests=False), path)
    out = with_stage(path, text, 7, "half", {"half": StageSpec(short=50, long=50)})
    new, old = parse_policy(path, out), parse_policy(path, text)
    assert (new.version, new.stage, new.stages) == (7, "half", {"half": StageSpec(short=50, long=50)})
    assert new.models == old.models and new.listen == old.listen and new.log_requests is False
    assert out.startswith("# Managed by pdfleet: rendered by `invoke provision`")


# ---- model groups: each model its own stage ------------------------------------------------------


def _grouped(**groups: Any) -> dict[str, Any]:
    """Aliases big, big-latest (group big) and small (group small) over the same pools."""
    pol = policy_dict(COLO, DIS, groups={"big": {}, "small": {}, **groups})
    pol["models"] = {
        "big": {"colocated": COLO, "disagg": DIS, "group": "big"},
        "big-latest": {"colocated": COLO, "disagg": DIS, "group": "big"},
        "small": {"colocated": COLO, "group": "small"},
    }
    return pol


def test_a_group_takes_what_it_leaves_out_from_the_top_level(tmp_path: Path) -> None:
    stages = {"mine": {"short": 10, "long": 90}}
    p = load_policy(
        write_test_policy(tmp_path, _grouped(big={"stage": "off"}, small={"stages": stages, "stage": "mine"}))
    )
    big, latest, small = p.routes["big"], p.routes["big-latest"], p.routes["small"]
    assert big.staging is not None and small.staging is not None
    assert (big.model, latest.model, small.model) == ("big", "big", "small")
    assert big.staging == latest.staging  # aliases of one group share its stage
    assert (big.staging.stage, big.staging.weights, big.staging.long_prompt_tokens) == (
        "off",
        StageSpec(short=0, long=0),
        1000,
    )
    assert (small.staging.stage, small.staging.weights) == ("mine", StageSpec(short=10, long=90))
    summary = p.summary()
    assert summary["groups"]["big"]["aliases"] == ["big", "big-latest"]
    assert summary["groups"]["small"]["stage"] == "mine" and summary["stage"] == "long-all"


def test_a_policy_without_groups_routes_every_alias_by_the_top_level(tmp_path: Path) -> None:
    p = load_test_policy(tmp_path)
    route = p.routes["llama"]
    assert route.staging is not None and route.group is None and route.model == "llama"
    assert (route.staging.stage, route.staging.weights, route.staging.long_prompt_tokens) == (
        "long-all",
        p.stage,
        p.spec.long_prompt_tokens,
    )
    assert "groups" not in p.spec.model_fields_set and p.summary()["groups"] == {}


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda p: p["models"]["small"].update(group="tiny"),
            "models.small.group: 'tiny' is not under groups",
        ),
        (lambda p: p["groups"].update(big={"stage": "nope"}), "groups.big.stage: 'nope' is not a stage"),
        (
            lambda p: p["groups"].update(big={"stages": {"x": {"short": 0, "long": 0}}}),
            "groups.big.stage: 'long-all' is not a stage; stages are: x",
        ),
        (lambda p: p["groups"].update(spare={}), "groups.spare: no alias under models: names this group"),
        (lambda p: p["models"]["big"].pop("group"), "models.big.group: the alias is named like group 'big'"),
        (lambda p: p["groups"].update(big={"long_prompt_tokens": 0}), "groups.big.long_prompt_tokens"),
    ],
)
def test_bad_groups_are_refused_naming_the_key(tmp_path: Path, change: Any, expected: str) -> None:
    pol = _grouped()
    change(pol)
    assert expected in policy_error(tmp_path, pol)


def test_with_stage_of_a_model_changes_that_group_only(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    text = policy_text(_grouped(big={"stage": "off"}), path)
    half = {"half": StageSpec(short=50, long=50)}
    new = parse_policy(path, with_stage(path, text, 9, "half", half, model="small"))
    old = parse_policy(path, text)
    assert new.version == 9 and new.groups["small"].stage == "half" and new.groups["small"].stages == half
    assert new.groups["big"] == old.groups["big"]
    assert (new.stage, new.stages, new.models) == (old.stage, old.stages, old.models)
    with pytest.raises(ValidationError, match="groups.nope: no such model group"):
        with_stage(path, text, 9, "half", half, model="nope")

"""Several models in one profile (issue 24): what each entry inherits, its key paths in errors, and the
checks across models (names, aliases, GPUs, ports, hosts), each refused with file and key path."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdfleet.errors import ValidationError
from pdfleet.model.inventory import load_inventory
from pdfleet.model.inventory_checks import check_against_inventory
from pdfleet.model.profile import Profile, ProfileError
from pdfleet.model.profile_loader import load_profile
from pdfleet.model.served import pool_hosts, slug
from tests.unit.model.helpers import GOOD, PROFILES

# GOOD's P/D model, plus a small model colocated only on the prefill host's second GPU.
TWO = """extends: _good
gateway: {model_alias: null}
models:
  - name: big
    aliases: [big-model]
  - name: small
    aliases: [small-model, small]
    model: {id: Qwen/Qwen2.5-0.5B-Instruct, max_model_len: 16384, revision: main}
    topology: colocated
    pools:
      prefill: null
      decode: null
      colocated:
        port: 8001
        gpus: [1]
        max_num_batched_tokens: 4096
        gpu_memory_utilization: 0.9
        hosts: [p1]
    gateway: {long_prompt_tokens: 4096, stage: colocated}
    slo: {ttft_p99_ms: 1000}
"""

# Two P/D models: the second one's pools on the other GPU of each host, its router left at the default port.
TWO_PD = """extends: _good
gateway: {model_alias: null}
models:
  - name: big
    aliases: [big-model]
  - name: second
    aliases: [second-model]
    kv_transfer: {side_channel_port: 5700}
    pools:
      prefill: {port: 8101, gpus: [1]}
      decode: {port: 8201, gpus: [1]}
"""

INV = """
all:
  children:
    prefill:
      hosts:
        p1: {ansible_host: 10.0.0.21, gpus: [0, 1], rdma_devices: [mlx5_0], rdma_netdev: eth1}
    decode:
      hosts:
        d1: {ansible_host: 10.0.0.31, gpus: [0, 1], rdma_devices: [mlx5_0], rdma_netdev: eth1}
"""


def _load(tmp_path: Path, text: str, name: str = "two") -> Profile:
    (tmp_path / "_good.yml").write_text(GOOD)
    (tmp_path / f"{name}.yml").write_text(text)
    return load_profile(name, tmp_path)


def test_a_single_model_profile_is_a_list_of_one_named_after_its_alias() -> None:
    profile = load_profile("lab-cross", PROFILES)
    (spec,) = profile.served
    assert (spec.name, spec.aliases, spec.listed) == ("llama-3-1-8b", ["llama-3.1-8b"], False)
    assert spec.pools == profile.pools and spec.kv_transfer == profile.kv_transfer
    assert spec.gateway.stages == profile.gateway.stages and spec.gateway.stage == profile.gateway.stage
    assert spec.gateway.router_port == profile.gateway.router_port and spec.rollout == profile.rollout
    assert spec.key("pools.colocated.port") == "pools.colocated.port"
    assert spec.served_model_names() == ["meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"]
    assert profile.served_model() == spec  # built from the top level on each call


def test_without_an_alias_the_name_is_a_slug_of_the_id(tmp_path: Path) -> None:
    (spec,) = _load(tmp_path, "extends: _good\n").served
    assert spec.name == "meta-llama-llama-3-1-8b-instruc" and spec.aliases == [
        "meta-llama/Llama-3.1-8B-Instruct"
    ]
    assert spec.served_model_names() == ["meta-llama/Llama-3.1-8B-Instruct"]


@pytest.mark.parametrize(
    ("text", "name"),
    [("Llama-3.1-8B", "llama-3-1-8b"), ("7b/chat", "m-7b-chat"), ("x" * 40, "x" * 31), ("a--b.", "a-b")],
)
def test_slug(text: str, name: str) -> None:
    assert slug(text) == name


def test_entries_inherit_the_top_level_and_override_it_key_by_key(tmp_path: Path) -> None:
    profile = _load(tmp_path, TWO)
    big, small = profile.served
    assert (big.name, big.aliases, big.key("pools"), big.listed) == (
        "big",
        ["big-model"],
        "models[0].pools",
        True,
    )
    assert big.topology == "cross-host" and big.pools.prefill is not None and big.has_router
    assert big.model == profile.model and big.gateway.long_prompt_tokens == 8192
    assert small.topology == "colocated" and small.pools.prefill is None and not small.has_router
    colocated = small.pools.get("colocated")
    assert (colocated.port, colocated.gpus, colocated.hosts) == (8001, [1], ["p1"])
    assert small.model.revision == "main" and small.model.max_model_len == 16384
    # mappings merge: the stages and the SLO's other targets come from the top level
    assert small.gateway.stage == "colocated" and small.gateway.stages == profile.gateway.stages
    assert small.slo.ttft_p99_ms == 1000 and small.slo.tpot_p99_ms == profile.slo.tpot_p99_ms
    assert small.key("pools.colocated.port") == "models[1].pools.colocated.port"
    assert small.served_model_names() == ["Qwen/Qwen2.5-0.5B-Instruct", "small-model", "small"]
    assert profile.served_model("small") is small


def test_naming_a_model_picks_it_and_an_unknown_name_lists_them(tmp_path: Path) -> None:
    profile = _load(tmp_path, TWO)
    with pytest.raises(ValidationError, match="several models; name one .*: big, small"):
        profile.served_model()
    with pytest.raises(ValidationError, match="no model 'huge' .*: big, small"):
        profile.served_model("huge")


def test_a_model_view_is_the_profile_as_if_it_served_that_model_alone(tmp_path: Path) -> None:
    profile = _load(tmp_path, TWO)
    small = profile.served[1]
    view = profile.for_model(small)
    assert view.served == (small,) and view.models is None
    assert view.topology == "colocated" and view.pools == small.pools and view.model == small.model
    assert view.gateway.model_alias == "small-model" and view.gateway.long_prompt_tokens == 4096
    assert view.gateway.port == profile.gateway.port and view.vllm == profile.vllm
    assert (
        view.gateway.stages == small.gateway.stages
        and view.gateway.router_policy == small.gateway.router_policy
    )
    assert view.model_dump() == type(view).model_validate(view.model_dump()).model_dump()  # a valid profile


def test_the_top_level_may_leave_per_model_keys_to_the_first_model(tmp_path: Path) -> None:
    text = GOOD.replace("topology: cross-host\n", "").replace(
        "model: {id: meta-llama/Llama-3.1-8B-Instruct, max_model_len: 32768}\n", ""
    )
    text += "models:\n  - {name: only, aliases: [a], topology: cross-host, model: {id: org/m}}\n"
    profile = _load(tmp_path, text, "bare")
    assert profile.topology == "cross-host" and profile.model.id == "org/m"
    assert [spec.name for spec in profile.served] == ["only"]


# (id, YAML after TWO's `models:` list is replaced or extended, key path, expected message text)
CASES: list[tuple[str, str, str, str]] = [
    (
        "schema_error_inside_the_list",
        TWO.replace("port: 8001", "port: 80010"),
        "models[1].pools.colocated.port",
        "must be <= 65535",
    ),
    (
        "name_not_a_slug",
        TWO.replace("name: small", "name: Small_1"),
        "models[1].name",
        "must match ^[a-z][a-z0-9-]{0,30}$ (got 'Small_1')",
    ),
    (
        "name_used_twice",
        TWO.replace("name: small", "name: big"),
        "models[1].name",
        "model name 'big' is used by 2 models",
    ),
    (
        "alias_defined_twice",
        TWO.replace("aliases: [small-model, small]", "aliases: [small-model, big-model]"),
        "models[1].aliases[1]",
        "alias 'big-model' is defined twice: by models 'big' and 'small'",
    ),
    (
        "model_alias_beside_models",
        TWO.replace("gateway: {model_alias: null}", "gateway: {model_alias: big}"),
        "gateway.model_alias",
        "a profile with models: names each model's aliases",
    ),
    (
        "no_aliases",
        TWO.replace("aliases: [big-model]", "aliases: []"),
        "models[0].aliases",
        "must have at least 1 item",
    ),
    (
        "model_key_unknown_in_an_entry",
        TWO.replace("gateway: {long_prompt_tokens: 4096, stage: colocated}", "gateway: {model_alias: x}"),
        "models[1].gateway.model_alias",
        "unknown key",
    ),
    (
        "stage_unknown_for_a_model",
        TWO.replace("stage: colocated}", "stage: everything}"),
        "models[1].gateway.stage",
        "'everything' is not a stage in models[1].gateway.stages",
    ),
    (
        "topology_problem_in_an_entry",
        TWO.replace("      prefill: null\n", ""),
        "models[1].pools.prefill",
        "a colocated profile runs only pools.colocated",
    ),
    (
        "router_ports_of_two_pd_models_clash",
        TWO_PD,
        "models[1].gateway.router_port",
        "port 8090 is used twice: by models[0].gateway.router_port and models[1].gateway.router_port",
    ),
]


@pytest.mark.parametrize(("case", "text", "key_path", "expected"), CASES, ids=[c[0] for c in CASES])
def test_bad_models_are_refused_with_file_and_key_path(
    tmp_path: Path, case: str, text: str, key_path: str, expected: str
) -> None:
    with pytest.raises(ValidationError) as err:
        _load(tmp_path, text, case)
    lines = str(err.value).splitlines()
    prefix = f"{tmp_path / case}.yml: {key_path}: "
    assert any(line.startswith(prefix) and expected in line for line in lines), "\n".join(lines)


def _checked(tmp_path: Path, text: str, inventory: str = INV) -> list[str]:
    """The inventory check's problems of a profile on an inventory ([] when it fits)."""
    profile = _load(tmp_path, text)
    inv = tmp_path / "inv.yml"
    inv.write_text(inventory)
    try:
        check_against_inventory(profile, load_inventory(inv))
    except ProfileError as err:
        return err.problems
    return []


def test_two_models_fit_an_inventory_and_a_pool_runs_where_its_hosts_say(tmp_path: Path) -> None:
    assert _checked(tmp_path, TWO) == []
    profile = _load(tmp_path, TWO)
    inventory = load_inventory(tmp_path / "inv.yml")
    big, small = profile.served
    assert [h.name for h in pool_hosts(inventory, small, "colocated")] == ["p1"]
    assert [h.name for h in pool_hosts(inventory, big, "decode")] == ["d1"]  # no hosts: its group


def test_a_hosts_entry_may_name_a_group(tmp_path: Path) -> None:
    assert _checked(tmp_path, TWO.replace("hosts: [p1]", "hosts: [decode]")) == []
    profile = _load(tmp_path, TWO.replace("hosts: [p1]", "hosts: [decode]"))
    inventory = load_inventory(tmp_path / "inv.yml")
    assert [h.name for h in pool_hosts(inventory, profile.served[1], "colocated")] == ["d1"]


@pytest.mark.parametrize(
    ("change", "key_path", "expected"),
    [
        (
            ("gpus: [1]", "gpus: [0]"),
            "models[1].pools.colocated.gpus",
            "GPU 0 is given to both models[0].pools.prefill and models[1].pools.colocated on host p1",
        ),
        (
            ("gpus: [1]", "gpus: [2]"),
            "models[1].pools.colocated.gpus",
            "GPU 2 is not on host p1",
        ),
        (
            ("port: 8001", "port: 8100"),
            "models[1].pools.colocated.port",
            "port 8100 is used twice on host p1: by models[0].pools.prefill.port and "
            "models[1].pools.colocated.port",
        ),
        (
            ("port: 8001", "port: 5600"),
            "models[1].pools.colocated.port",
            "port 5600 is used twice on host p1: by models[0].kv_transfer.side_channel_port",
        ),
        (
            ("hosts: [p1]", "hosts: [p1, nosuch]"),
            "models[1].pools.colocated.hosts[1]",
            "'nosuch' names no host or group of {inv}; hosts: p1, d1; groups: prefill, decode",
        ),
    ],
    ids=[
        "gpu_given_to_two_models",
        "gpu_over_committed",
        "port_reused",
        "side_channel_port_reused",
        "no_such_host",
    ],
)
def test_a_host_given_twice_is_refused(
    tmp_path: Path, change: tuple[str, str], key_path: str, expected: str
) -> None:
    problems = _checked(tmp_path, TWO.replace(*change))
    prefix = f"{tmp_path / 'two'}.yml: {key_path}: "
    wanted = expected.format(inv=tmp_path / "inv.yml")
    assert any(p.startswith(prefix) and wanted in p for p in problems), "\n".join(problems)


def test_a_kv_events_publisher_s_port_counts_on_its_host(tmp_path: Path) -> None:
    """The small model (models[1]) publishes KV events at 5557 + 1 on p1 once the decider reads them."""
    text = TWO.replace(
        "gateway: {model_alias: null}", "gateway: {model_alias: null, decider: {threshold_on: effective}}"
    ).replace("stage: colocated}", "stage: colocated, decider: {cache_source: kv_events}}")
    assert _checked(tmp_path, text) == []
    problems = _checked(tmp_path, text.replace("port: 8001", "port: 5558"))
    wanted = (
        "models[1].gateway.decider.cache_source: port 5558 is used twice on host p1: by "
        "models[1].pools.colocated.port and models[1].gateway.decider.cache_source "
        "(kv_events: models[1].pools.colocated's publisher, 5557 + the model's place)"
    )
    assert any(p.endswith(wanted) for p in problems), "\n".join(problems)
    assert _checked(tmp_path, TWO.replace("port: 8001", "port: 5558")) == []  # no publisher without kv_events


def test_the_monitoring_port_counts_on_a_monitoring_host(tmp_path: Path) -> None:
    inventory = INV + "    monitoring:\n      hosts:\n        p1:\n"
    problems = _checked(tmp_path, TWO.replace("port: 8001", "port: 9090"), inventory)
    assert any("port 9090 is used twice on host p1" in p and "monitoring.port" in p for p in problems), (
        problems
    )


def test_two_pd_models_fit_with_a_router_each(tmp_path: Path) -> None:
    text = TWO_PD + "    gateway: {router_port: 8091, router_prometheus_port: 29001}\n"
    inventory = INV + "    gateway:\n      hosts:\n        gw: {ansible_host: 10.0.0.10}\n"
    problems = _checked(tmp_path, text, inventory)
    # the gateway needs a colocated pool per model; nothing else is wrong
    assert problems and all(": models[" in p and ".pools.colocated: " in p for p in problems), problems
    profile = _load(tmp_path, text)
    assert [(s.gateway.router_port, s.has_router) for s in profile.served] == [(8090, True), (8091, True)]

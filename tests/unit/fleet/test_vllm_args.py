"""The server command line of each instance comes from its own model's spec (issue 24): model id, the names
it answers to, its pool's limits, its revision, and its KV connector."""

from __future__ import annotations

from pathlib import Path

from pdfleet.fleet.vllm_args import kv_transfer_config, serve_argv
from pdfleet.model.profile_loader import load_profile
from pdfleet.sim.config import parse_serve_args
from pdfleet.sim.serve_options import parse_argv
from tests.unit.fleet.helpers import REPO, deploy


def _argv_of(fleet_profile: str, host: str, model: str, profiles: Path = REPO / "profiles") -> list[str]:
    fleet = deploy(fleet_profile, REPO / "inventory/lab.yml", profiles)
    (inst,) = [i for i in fleet.topology.on_host(host) if i.model == model]
    return serve_argv(fleet.profile, fleet.inventory.hosts[host], inst)


def _after(argv: list[str], flag: str) -> list[str]:
    """The values after a flag, up to the next flag."""
    start = argv.index(flag) + 1
    end = next((i for i in range(start, len(argv)) if argv[i].startswith("--")), len(argv))
    return argv[start:end]


def test_each_instance_serves_its_own_model() -> None:
    small = _argv_of("lab-two-models", "lab-colo2", "llama-1b")
    big = _argv_of("lab-two-models", "lab-colo2", "llama-8b")
    assert small[2] == "meta-llama/Llama-3.2-1B-Instruct" and big[2] == "meta-llama/Llama-3.1-8B-Instruct"
    assert _after(small, "--served-model-name") == ["meta-llama/Llama-3.2-1B-Instruct", "llama-3.2-1b"]
    assert _after(big, "--served-model-name") == ["meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"]
    assert (_after(small, "--port"), _after(big, "--port")) == (["8001"], ["8000"])
    assert _after(small, "--max-num-batched-tokens") == ["4096"] and _after(small, "--max-model-len") == [
        "16384"
    ]
    assert "--revision" not in small


def test_a_revision_is_rendered_and_the_simulator_takes_it(tmp_path: Path) -> None:
    for path in (REPO / "profiles").glob("*.yml"):
        (tmp_path / path.name).write_text(path.read_text())
    two = (tmp_path / "lab-two-models.yml").read_text()
    (tmp_path / "lab-two-models.yml").write_text(
        two.replace(
            "      id: meta-llama/Llama-3.2-1B-Instruct\n",
            "      id: meta-llama/Llama-3.2-1B-Instruct\n      revision: 4e20de3\n",
        )
    )
    argv = _argv_of("lab-two-models", "lab-colo2", "llama-1b", tmp_path)
    assert _after(argv, "--revision") == ["4e20de3"]
    parse_argv(argv[2:])  # the simulator accepts what vLLM's parser accepts


def test_only_pd_instances_get_their_models_connector() -> None:
    fleet = deploy("lab-two-models", REPO / "inventory/lab.yml")
    profile = load_profile("lab-two-models", REPO / "profiles")
    configs = {
        (i.host, i.model, i.pool): kv_transfer_config(profile, fleet.inventory.hosts[i.host], i)
        for i in fleet.topology.instances
    }
    assert configs[("lab-colo2", "llama-1b", "colocated")] is None
    prefill = configs[("lab-p1", "llama-8b", "prefill")]
    assert prefill is not None and (prefill["kv_connector"], prefill["kv_role"]) == (
        "NixlConnector",
        "kv_producer",
    )


def test_a_models_entry_turns_kv_events_on_for_its_own_colocated_instances(tmp_path: Path) -> None:
    for path in (REPO / "profiles").glob("*.yml"):
        (tmp_path / path.name).write_text(path.read_text())
    two = (tmp_path / "lab-two-models.yml").read_text()
    mine = "    gateway:\n      long_prompt_tokens: 4096\n"
    assert two.count(mine) == 1
    (tmp_path / "lab-two-models.yml").write_text(
        two.replace(mine, mine + "      decider: {cache_source: kv_events}\n")
    )
    (tmp_path / "ev.yml").write_text(
        "extends: lab-two-models\ngateway: {decider: {colocated_choice: prefix_load}}\n"
    )
    small = _argv_of("ev", "lab-colo2", "llama-1b", tmp_path)
    big = _argv_of("ev", "lab-colo2", "llama-8b", tmp_path)
    assert "--kv-events-config" not in big  # the other model keeps the gateway's index
    # the second model of `models:` publishes at vLLM's default port plus its place, its replay socket too
    assert _after(small, "--kv-events-config") == [
        '{"enable_kv_cache_events":true,"endpoint":"tcp://*:5558","publisher":"zmq",'
        '"replay_endpoint":"tcp://*:5758"}'
    ]
    parse_serve_args(small[2:])  # the simulator reads it as the release's KVEventsConfig

"""Loading profiles: listing, names and paths, `extends:` merging, bases, and every error named by file
and key path (schema and semantic problems alike, as load_profile reports them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdfleet.errors import ValidationError
from pdfleet.model.inventory import load_inventory
from pdfleet.model.inventory_checks import check_against_inventory
from pdfleet.model.profile import ProfileError
from pdfleet.model.profile_loader import list_profiles, load_profile
from tests.unit.model.helpers import GOOD, PROFILES, REPO, SAME_HOST, SHIPPED


def test_shipped_profiles_are_listed_and_bases_are_not() -> None:
    names = list_profiles(PROFILES)
    assert set(SHIPPED) <= set(names)
    assert not [n for n in names if n.startswith("_")]


def test_load_by_path_and_extends_merge(tmp_path: Path) -> None:
    (tmp_path / "_common.yml").write_text((PROFILES / "_base.yml").read_text())
    child = tmp_path / "mine.yml"
    child.write_text(
        """
extends: _common
topology: colocated
gateway: {port: 9080}
vllm: {engine: sim}
pools:
  colocated: {port: 8000, gpus: [1], max_num_batched_tokens: 4096, gpu_memory_utilization: 0.5}
"""
    )
    profile = load_profile(str(child), tmp_path / "elsewhere")
    # mappings merge key by key: the child's gateway.port, the base's router_port and stages
    assert profile.gateway.port == 9080 and profile.gateway.router_port == 8090
    assert "long-prompts" in profile.gateway.stages
    assert profile.vllm.engine == "sim" and profile.vllm.version == "0.33.0"
    assert profile.vllm.sim.link == "pcie-gen5"
    assert list_profiles(tmp_path) == ["mine"]


def test_null_in_child_clears_base_key(tmp_path: Path) -> None:
    (tmp_path / "_common.yml").write_text((PROFILES / "_base.yml").read_text())
    (tmp_path / "p.yml").write_text(
        """
extends: _common
topology: colocated
model: {max_model_len: null}
pools:
  colocated: {port: 8000, gpus: [0], max_num_batched_tokens: 8192, gpu_memory_utilization: 0.9}
"""
    )
    assert load_profile("p", tmp_path).model.max_model_len is None


def test_base_profiles_are_not_runnable() -> None:
    with pytest.raises(ValidationError, match="is a base for `extends:`, not a runnable profile"):
        load_profile("_base", PROFILES)


# (id, YAML of the case file, key path, expected message text). `{file}` is the case file.
CASES: list[tuple[str, str, str, str]] = [
    (
        "gpu_memory_utilization_too_high",
        "extends: _good\npools: {decode: {gpu_memory_utilization: 0.99}}\n",
        "pools.decode.gpu_memory_utilization",
        "must be <= 0.98 (got 0.99)",
    ),
    (
        "unknown_top_level_key",
        "extends: _good\nrouter: {port: 1}\n",
        "router",
        "unknown key; allowed: extends, description, topology, model, vllm, kv_transfer, pools, gpu, rdma,",
    ),
    (
        "unknown_pool_key",
        "extends: _good\npools: {prefill: {max_batched_tokens: 4096}}\n",
        "pools.prefill.max_batched_tokens",
        "unknown key; allowed: port, gpus, tensor_parallel_size, max_num_batched_tokens,",
    ),
    (
        "mooncake_transfer_engine",
        "extends: _good\nkv_transfer: {connector: MooncakeTransferEngine}\n",
        "kv_transfer.connector",
        "'MooncakeTransferEngine' is not a vLLM connector; did you mean MooncakeConnector?",
    ),
    (
        "misspelt_connector",
        "extends: _good\nkv_transfer: {connector: NixlConector}\n",
        "kv_transfer.connector",
        "'NixlConector' is not a vLLM connector; did you mean NixlConnector?",
    ),
    (
        "mooncake_predates_pinned_vllm",
        "extends: _good\nkv_transfer: {connector: MooncakeConnector}\n",
        "kv_transfer.connector",
        "MooncakeConnector is not registered in vLLM 0.11.0 "
        "(vllm/distributed/kv_transfer/kv_connector/factory.py); pin a release that has it "
        "or use NixlConnector",
    ),
    (
        "real_connector_pdfleet_does_not_render",
        "extends: _good\nkv_transfer: {connector: OffloadingConnector}\n",
        "kv_transfer.connector",
        "OffloadingConnector is a vLLM connector but not one pdfleet renders P/D units for",
    ),
    (
        "kv_both_on_prefill",
        "extends: _good\npools: {prefill: {kv_role: kv_both}}\n",
        "pools.prefill.kv_role",
        "kv_both is not used: prefill is kv_producer and decode kv_consumer; use kv_producer",
    ),
    (
        "consumer_on_prefill",
        "extends: _good\npools: {prefill: {kv_role: kv_consumer}}\n",
        "pools.prefill.kv_role",
        "must be kv_producer for the prefill pool (got kv_consumer)",
    ),
    (
        "kv_role_on_colocated",
        "extends: _good\ntopology: colocated\npools:\n  prefill: null\n  decode: null\n"
        "  colocated: {port: 8000, gpus: [0], max_num_batched_tokens: 8192, gpu_memory_utilization: 0.9,"
        " kv_role: kv_both}\n",
        "pools.colocated.kv_role",
        "the colocated pool runs without a KV connector; remove kv_role",
    ),
    (
        "side_channel_localhost_cross_host",
        "extends: _good\nkv_transfer: {side_channel_host: localhost}\n",
        "kv_transfer.side_channel_host",
        "'localhost' is not reachable from other hosts in a cross-host topology; use auto",
    ),
    (
        "bad_topology",
        "extends: _good\ntopology: split\n",
        "topology",
        "must be one of 'same-host', 'cross-host' or 'colocated' (got 'split')",
    ),
    (
        "same_host_same_gpu",
        "extends: _good\ntopology: same-host\npools: {decode: {gpus: [0]}}\n",
        "pools.decode.gpus",
        "GPU 0 is given to both pools.prefill and pools.decode on a same-host host",
    ),
    (
        "same_host_port_clash_with_side_channel",
        SAME_HOST + "kv_transfer: {side_channel_port: 8199}\n",
        "kv_transfer.side_channel_port+1",
        "port 8200 is used twice on a same-host host: by pools.decode.port and "
        "kv_transfer.side_channel_port+1 (decode side channel)",
    ),
    (
        "gateway_port_equals_router_port",
        "extends: _good\ngateway: {router_port: 8080}\n",
        "gateway.router_port",
        "port 8080 is used twice: by gateway.port and gateway.router_port",
    ),
    (
        "stage_not_defined",
        "extends: _good\ngateway: {stage: everything}\n",
        "gateway.stage",
        "'everything' is not a stage in gateway.stages; stages: colocated, long-prompts",
    ),
    (
        "tp_does_not_match_gpus",
        "extends: _good\npools: {prefill: {gpus: [0, 1]}}\n",
        "pools.prefill.gpus",
        "lists 2 GPU(s) but tensor_parallel_size is 1",
    ),
    (
        "extra_args_sets_managed_flag",
        "extends: _good\npools: {decode: {extra_args: ['--enforce-eager', '--port=9000']}}\n",
        "pools.decode.extra_args[1]",
        "--port is rendered by pdfleet from pools.decode.port; set that key instead",
    ),
    (
        "unpinned_vllm",
        "extends: _good\nvllm: {version: latest}\n",
        "vllm.version",
        "must be an exact vLLM release like 0.33.0 (got 'latest')",
    ),
    (
        "vllm_older_than_supported",
        "extends: _good\nvllm: {version: 0.9.2}\n",
        "vllm.version",
        "vLLM 0.9.2 is older than pdfleet supports (>= 0.10.0)",
    ),
    (
        "load_failure_policy_before_it_existed",
        "extends: _good\nkv_transfer: {load_failure_policy: fail}\n",
        "kv_transfer.load_failure_policy",
        "vLLM 0.11.0 has no kv_transfer_config.kv_load_failure_policy (vllm/config/kv_transfer.py) "
        "and ignores it without a word",
    ),
    (
        "colocated_topology_with_prefill_pool",
        "extends: _good\ntopology: colocated\n"
        "pools:\n  prefill: {port: 8100}\n"
        "  colocated: {port: 8000, gpus: [0], max_num_batched_tokens: 8192, gpu_memory_utilization: 0.9}\n",
        "pools.prefill",
        "a colocated profile runs only pools.colocated",
    ),
    (
        "disagg_missing_decode",
        "extends: _good\npools: {decode: null}\n",
        "pools.decode",
        "required key is missing: topology cross-host runs prefill and decode",
    ),
    (
        # the simulator plays MooncakeConnector too, but only for a release that registers it
        "sim_engine_with_mooncake_on_0_11",
        "extends: _good\nvllm: {version: '0.11.0', engine: sim}\n"
        "kv_transfer: {connector: MooncakeConnector}\n",
        "kv_transfer.connector",
        "MooncakeConnector is not registered in vLLM 0.11.0",
    ),
    (
        "fabric_manager_not_bool",
        "extends: _good\ngpu: {fabric_manager: maybe}\n",
        "gpu.fabric_manager",
        "must be 'auto' or true or false (got 'maybe')",
    ),
    (
        "port_as_string",
        "extends: _good\npools: {prefill: {port: '8100'}}\n",
        "pools.prefill.port",
        "must be an integer (got '8100')",
    ),
    (
        "unknown_sim_link",
        "extends: _good\nvllm: {sim: {link: infiniband}}\n",
        "vllm.sim.link",
        "must be one of 'pcie-gen4', 'pcie-gen5', 'nvlink', 'roce-100g', 'roce-200g', 'roce-400g' or 'tcp'",
    ),
    (
        "name_key_is_reserved",
        "extends: _good\nname: other\n",
        "name",
        "set by pdfleet from the file name; remove this key",
    ),
    (
        "missing_required_section",
        GOOD.replace(
            "slo: {ttft_p99_ms: 3000, tpot_p99_ms: 60, itl_p99_ms: 200, kv_transfer_p99_ms: 500}\n", ""
        ),
        "slo",
        "required key is missing",
    ),
    (
        "extends_missing_base",
        "extends: _nosuch\n",
        "extends",
        "no profile '_nosuch' in",
    ),
    (
        "long_threshold_above_context",
        "extends: _good\ngateway: {long_prompt_tokens: 40000}\n",
        "gateway.long_prompt_tokens",
        "must be < model.max_model_len (32768), or no prompt is ever long (got 40000)",
    ),
    (
        "driver_version_outside_branch",
        "extends: _good\ngpu: {driver_version: 575.51.03}\n",
        "gpu.driver_version",
        "575.51.03 is not in driver_branch 580",
    ),
    (
        "mirror_not_a_url",
        "extends: _good\nmirrors: {pypi: 198.18.0.1:8082/simple}\n",
        "mirrors.pypi",
        "must be an http:// or https:// URL (got '198.18.0.1:8082/simple')",
    ),
    # issue 18 C1: a control character in any string would add a line to a unit, the policy or apt's list
    *[
        (
            f"newline_in_{where.replace('.', '_').replace('[0]', '')}",
            text,
            where,
            "contains the control character U+000A (LINE FEED)",
        )
        for where, text in [
            ("model.id", 'extends: _good\nmodel: {id: "m\\nExecStartPre=/bin/sh -c id"}\n'),
            ("model.served_model_name", 'extends: _good\nmodel: {served_model_name: "m\\nx=y"}\n'),
            ("gateway.model_alias", 'extends: _good\ngateway: {model_alias: "a\\nstage: all"}\n'),
            ("pools.decode.kv_cache_dtype", 'extends: _good\npools: {decode: {kv_cache_dtype: "fp8\\nx"}}\n'),
            ("pools.decode.extra_args[0]", 'extends: _good\npools: {decode: {extra_args: ["--a\\nb=c"]}}\n'),
            (
                "mirrors.apt",
                'extends: _good\nmirrors: {apt: "http://m/ ./\\ndeb [trusted=yes] http://evil/ ./"}\n',
            ),
        ]
    ],
    (
        "tab_in_description",
        'extends: _good\ndescription: "a\\tb"\n',
        "description",
        "contains the control character U+0009 (TAB)",
    ),
    # issue 18 C2: paths on the hosts are absolute and normalised (render writes them under --out)
    *[
        (
            f"keys_file_{name}",
            f"extends: _good\ngateway: {{keys_file: '{path}'}}\n",
            "gateway.keys_file",
            "must be an absolute, normalised path like /etc/pdfleet/gateway/keys.yaml "
            f"(no '..', '.', '//' or "
            f"trailing '/') (got '{path}')",
        )
        for name, path in [
            ("relative", "keys.yaml"),
            ("parent", "/etc/pdfleet/../../tmp/keys.yaml"),
            ("dot", "/etc/./keys.yaml"),
            ("double_slash", "//etc/keys.yaml"),
            ("trailing_slash", "/etc/pdfleet/"),
            ("root", "/"),
        ]
    ],
    ("venv_relative", "extends: _good\nvllm: {venv: venv}\n", "vllm.venv", "must be an absolute, normalised"),
    # issue 18 C7: the gateway refuses a keys file that holds one key twice
    (
        "same_key_file_twice",
        "extends: _good\ngateway: {client_key_file: ~/k/gw.key, admin_key_file: ~/k/../k/gw.key}\n",
        "gateway.admin_key_file",
        "is the same file as gateway.client_key_file (~/k/gw.key); the admin key must differ",
    ),
    # issue 32: a bypass bound reads a P/D pool's queues
    (
        "decider_bound_without_pd_pool",
        "extends: _good\ntopology: colocated\npools:\n  prefill: null\n  decode: null\n"
        "  colocated: {port: 8000, gpus: [0], max_num_batched_tokens: 8192, gpu_memory_utilization: 0.9}\n"
        "gateway: {decider: {decode_busy_waiting: 4}}\n",
        "gateway.decider.decode_busy_waiting",
        "no model of this profile has a P/D pool (prefill and decode), so there is no queue to bound",
    ),
    # issue 18 C9: YAML 1.1 reads unquoted off/no/yes/on as booleans
    (
        "stage_off_is_a_boolean",
        "extends: _good\ngateway: {stage: off}\n",
        "gateway.stage",
        "must be a string, but YAML read the unquoted value as the boolean false (it reads unquoted no, off "
        "and false that way); quote it",
    ),
    (
        "stage_name_yes_is_a_boolean",
        "extends: _good\ngateway: {stages: {yes: {short: 0, long: 100}}}\n",
        "gateway.stages.true",
        "the key must be a string, but YAML read the unquoted value as the boolean true",
    ),
    (
        "version_is_a_number",
        "extends: _good\nvllm: {version: 0.11}\n",
        "vllm.version",
        'must be a string, but YAML read the unquoted value as the number 0.11; quote it: "0.11"',
    ),
    (
        "mooncake_rdma_without_rdma",
        "extends: _good\nvllm: {version: '0.33.0'}\nrdma: {enabled: false}\n"
        "kv_transfer: {connector: MooncakeConnector}\n",
        "kv_transfer.mooncake_protocol",
        "rdma needs rdma.enabled: true; enable RDMA or use mooncake_protocol: tcp",
    ),
]


def _write_good(directory: Path) -> None:
    (directory / "_good.yml").write_text(GOOD)


@pytest.mark.parametrize(("case", "text", "key_path", "expected"), CASES, ids=[c[0] for c in CASES])
def test_bad_profile_message(tmp_path: Path, case: str, text: str, key_path: str, expected: str) -> None:
    _write_good(tmp_path)
    path = tmp_path / f"{case}.yml"
    path.write_text(text)
    with pytest.raises(ValidationError) as err:
        load_profile(case, tmp_path)
    lines = str(err.value).splitlines()
    prefix = f"{path}: {key_path}: "
    matching = [line for line in lines if line.startswith(prefix)]
    assert matching, f"no line starting {prefix!r} in:\n" + "\n".join(lines)
    assert any(expected in line for line in matching), "\n".join(lines)


def test_table_has_enough_distinct_cases() -> None:
    assert len({c[0] for c in CASES}) == len(CASES) >= 15


def test_good_base_is_valid(tmp_path: Path) -> None:
    """The table's base validates, so each case fails for its own reason only."""
    _write_good(tmp_path)
    (tmp_path / "ok.yml").write_text("extends: _good\n")
    (tmp_path / "same.yml").write_text(SAME_HOST)
    assert load_profile("ok", tmp_path).topology == "cross-host"
    assert load_profile("same", tmp_path).topology == "same-host"
    mooncake = "extends: _good\nvllm: {version: '0.33.0'}\nkv_transfer: {connector: MooncakeConnector}\n"
    (tmp_path / "mooncake.yml").write_text(mooncake)
    profile = load_profile("mooncake", tmp_path)
    assert profile.kv_transfer.bootstrap_port_for("prefill") == 8998
    assert profile.kv_transfer.side_channel_port_for("prefill") is None


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    _write_good(tmp_path)
    (tmp_path / "many.yml").write_text(
        "extends: _good\npools: {decode: {gpu_memory_utilization: 2, port: 0}}\ngpu: {driver_branch: r580}\n"
    )
    with pytest.raises(ProfileError) as err:
        load_profile("many", tmp_path)
    paths = {line.split(": ")[1] for line in err.value.problems}
    assert paths == {"pools.decode.gpu_memory_utilization", "pools.decode.port", "gpu.driver_branch"}


def test_error_in_base_is_reported_against_the_base(tmp_path: Path) -> None:
    (tmp_path / "_good.yml").write_text(
        GOOD.replace("gpu_memory_utilization: 0.90", "gpu_memory_utilization: 1.5")
    )
    (tmp_path / "child.yml").write_text("extends: _good\ndescription: inherits a bad value\n")
    with pytest.raises(ValidationError) as err:
        load_profile("child", tmp_path)
    assert f"{tmp_path / '_good.yml'}: pools.decode.gpu_memory_utilization: must be <= 0.98" in str(err.value)


def test_unknown_profile_lists_available(tmp_path: Path) -> None:
    _write_good(tmp_path)
    for name in ("alpha", "beta"):
        (tmp_path / f"{name}.yml").write_text("extends: _good\n")
    with pytest.raises(ValidationError) as err:
        load_profile("gamma", tmp_path)
    assert str(err.value) == f"unknown profile 'gamma' in {tmp_path}; available: alpha, beta"


def test_extends_cycle(tmp_path: Path) -> None:
    (tmp_path / "a.yml").write_text("extends: b\n")
    (tmp_path / "b.yml").write_text("extends: c\n")
    (tmp_path / "c.yml").write_text("extends: a\n")
    with pytest.raises(ValidationError) as err:
        load_profile("a", tmp_path)
    assert f"{tmp_path / 'c.yml'}: extends: cycle a -> b -> c -> a" in str(err.value)


def test_extends_finds_a_shipped_profile_from_a_site_profile_kept_anywhere(tmp_path: Path) -> None:
    site = tmp_path / "site" / "ours.yml"
    site.parent.mkdir()
    site.write_text("extends: cross-rdma\ndescription: our site\nrdma: {mtu: 4200}\n")
    profile = load_profile(str(site), PROFILES)
    assert profile.topology == "cross-host" and profile.description == "our site"
    assert profile.rdma.mtu == 4200 and profile.rdma.min_bandwidth_gbps == 350
    # errors and origins point at the file that set each key: the site file, the shipped profile, its base
    assert profile.origin_of("rdma.mtu") == site
    assert profile.origin_of("rdma.min_bandwidth_gbps") == PROFILES / "cross-rdma.yml"
    assert profile.origin_of("gateway.stages") == PROFILES / "_base.yml"


def test_extends_looks_in_the_file_s_own_folder_first(tmp_path: Path) -> None:
    shipped = (PROFILES / "cross-rdma.yml").read_text()
    assert "mtu: 9000" in shipped
    (tmp_path / "cross-rdma.yml").write_text(shipped.replace("mtu: 9000", "mtu: 4200"))
    (tmp_path / "ours.yml").write_text("extends: cross-rdma\n")
    profile = load_profile(str(tmp_path / "ours.yml"), PROFILES)
    assert profile.rdma.mtu == 4200 and profile.origin_of("rdma.mtu") == tmp_path / "cross-rdma.yml"
    # the local cross-rdma's own `extends: _base` is not in its folder: the profiles dir has it
    assert profile.origin_of("gateway.stages") == PROFILES / "_base.yml"


def test_a_site_file_named_like_a_shipped_profile_extends_the_shipped_one(tmp_path: Path) -> None:
    (tmp_path / "cross-rdma.yml").write_text("extends: cross-rdma\nrdma: {mtu: 4200}\n")
    profile = load_profile(str(tmp_path / "cross-rdma.yml"), PROFILES)
    assert profile.rdma.mtu == 4200 and profile.origin_of("rdma.dscp") == PROFILES / "cross-rdma.yml"


def test_extends_missing_everywhere_names_both_folders(tmp_path: Path) -> None:
    (tmp_path / "ours.yml").write_text("extends: cross-rmda\n")
    with pytest.raises(ValidationError) as err:
        load_profile(str(tmp_path / "ours.yml"), PROFILES)
    message = str(err.value)
    assert message.startswith(
        f"{tmp_path / 'ours.yml'}: extends: no profile 'cross-rmda' in {tmp_path} or {PROFILES}; available: "
    )
    assert "cross-rdma" in message and "ours" in message


def test_yaml_syntax_error_has_line_number(tmp_path: Path) -> None:
    (tmp_path / "broken.yml").write_text(
        "topology: cross-host\npools:\n  prefill: {port: 8100\n  decode: x\n"
    )
    with pytest.raises(ValidationError) as err:
        load_profile("broken", tmp_path)
    assert str(err.value).startswith(f"{tmp_path / 'broken.yml'}:4:")
    assert "invalid YAML" in str(err.value)


def test_duplicate_key_is_an_error(tmp_path: Path) -> None:
    _write_good(tmp_path)
    (tmp_path / "dup.yml").write_text("extends: _good\ntopology: cross-host\ntopology: same-host\n")
    with pytest.raises(ValidationError, match=r"dup.yml:3:1: invalid YAML: .*duplicate key 'topology'"):
        load_profile("dup", tmp_path)


@pytest.mark.parametrize(
    ("profile", "base", "inventory"),
    [
        ("lab-colocated", "colocated", "lab.yml"),
        ("lab-cross", "cross-rdma", "lab.yml"),
        ("lab-same-host", "same-host-pcie", "lab-same-host.yml"),
    ],
)
def test_lab_profiles_extend_the_real_ones_with_sim_and_mirrors(
    profile: str, base: str, inventory: str
) -> None:
    lab = load_profile(profile, REPO / "profiles")
    real = load_profile(base, REPO / "profiles")
    assert lab.extends == base
    assert lab.vllm.engine == "sim"
    assert lab.mirrors.apt == "http://198.18.0.1:8081/" and lab.mirrors.apt_trusted
    assert lab.mirrors.pypi == "http://198.18.0.1:8082/simple/"
    assert lab.mirrors.pypi_trusted_host == "198.18.0.1"
    assert lab.topology == real.topology
    assert (lab.pools.prefill, lab.pools.decode) == (real.pools.prefill, real.pools.decode)
    # lab-cross adds the colocated baseline beside its P/D pair (what the gateway routes between)
    assert lab.pools.colocated is not None  # every profile has the colocated baseline the gateway needs
    # lab-cross installs NIXL's CPU build beside the simulator and moves it over the bridge (docs/kv-path.md)
    lab_only = {"sim_library", "sim_bytes_fraction", "ucx_tls", "ucx_tcp_port_range"}
    assert lab.kv_transfer.model_dump(exclude=lab_only) == real.kv_transfer.model_dump(exclude=lab_only)
    assert lab.vllm.sim == real.vllm.sim
    check_against_inventory(lab, load_inventory(REPO / "inventory" / inventory))


def test_the_mooncake_lab_profile_is_lab_cross_over_mooncake_on_a_release_that_has_it() -> None:
    from pdfleet.model.vllm_release_data import RELEASES
    from pdfleet.model.vllm_releases import find_release

    lab = load_profile("lab-cross-mooncake", REPO / "profiles")
    cross = load_profile("lab-cross", REPO / "profiles")
    assert lab.extends == "lab-cross" and lab.vllm.engine == "sim"
    assert lab.kv_transfer.connector == "MooncakeConnector" and cross.kv_transfer.connector == "NixlConnector"
    assert lab.kv_transfer.mooncake_protocol == "tcp"  # the lab's containers have no RDMA NICs
    assert lab.kv_transfer.sim_library  # the simulators move their KV bytes through Mooncake's engine
    rel = find_release(lab.vllm.version, RELEASES)
    assert rel is not None and rel.has_connector("MooncakeConnector")
    assert (lab.pools, lab.gateway, lab.mirrors) == (cross.pools, cross.gateway, cross.mirrors)
    check_against_inventory(lab, load_inventory(REPO / "inventory" / "lab.yml"))

"""Semantic checks of a profile the schema cannot express: topology vs pools, kv_role, connector vs
pinned vLLM, extra_args vs rendered flags, ports and GPUs that one host would use twice.

Checks that need the hosts (groups, GPU indices, RDMA devices) are in inventory_checks.
"""

from __future__ import annotations

import ipaddress
import os
from collections import Counter
from collections.abc import Iterable

from pdfleet.model import connectors
from pdfleet.model.connectors import MOONCAKE, NIXL
from pdfleet.model.host_checks import HostRuns, host_problems
from pdfleet.model.platforms import PLATFORM_KEYS, PLATFORMS, branches_by_platform
from pdfleet.model.problems import Problem
from pdfleet.model.profile import DEFAULT_KV_ROLES, PoolSpec, Profile
from pdfleet.model.rebalancing import rebalance_problems
from pdfleet.model.release_checks import managed_flag, release_problems
from pdfleet.model.rollout import rollout_problems
from pdfleet.model.served import ServedModel
from pdfleet.model.vllm_kv_events import event_format
from pdfleet.model.vllm_release_data import NEWEST, RELEASES
from pdfleet.model.vllm_releases import Release, find_release
from pdfleet.model.weights_checks import one_revision_per_model_id, pd_weights_problems, weights_problems

# vllm serve flags pdfleet renders from pool keys; extra_args must not set them a second time.
MANAGED_FLAGS: dict[str, str] = {
    "--host": "the host's inventory address",
    "--port": "{pool}.port",
    "--tensor-parallel-size": "{pool}.tensor_parallel_size",
    "-tp": "{pool}.tensor_parallel_size",
    "--max-num-batched-tokens": "{pool}.max_num_batched_tokens",
    "--gpu-memory-utilization": "{pool}.gpu_memory_utilization",
    "--max-num-seqs": "{pool}.max_num_seqs",
    "--kv-cache-dtype": "{pool}.kv_cache_dtype",
    "--enable-chunked-prefill": "{pool}.enable_chunked_prefill",
    "--no-enable-chunked-prefill": "{pool}.enable_chunked_prefill",
    "--max-model-len": "{pool}.max_model_len or model.max_model_len",
    "--kv-transfer-config": "kv_transfer and {pool}.kv_role",
    "--kv-events-config": "gateway.decider.cache_source",
    "--served-model-name": "model.served_model_name",
    "--revision": "model.revision",
}


def profile_problems(profile: Profile) -> list[Problem]:
    """Every problem visible from the profile alone (no inventory), for each model it serves."""
    version = connectors.parse_version(profile.vllm.version)
    problems = list(_version_problems(profile, version))
    rel = find_release(profile.vllm.version, RELEASES) if version is not None else None
    for spec in profile.served:
        problems += model_problems(profile, spec, rel)
    problems += _served_problems(profile)
    problems += one_revision_per_model_id(profile)
    problems += _key_file_problems(profile)
    problems += _decider_problems(profile)
    problems += _driver_problems(profile)
    problems += _mirror_problems(profile)
    problems += host_problems(profile, HostRuns(gateway=True), where=None)
    return list(dict.fromkeys(problems))


def model_problems(profile: Profile, spec: ServedModel, rel: Release | None) -> list[Problem]:
    """One model's problems: its pools for its topology, KV roles and connector, stages and plans."""
    problems: list[Problem] = []
    if rel is not None:
        view = profile.for_model(spec)
        problems += [Problem(spec.key(path), message) for path, message in release_problems(view, rel)]
    problems += _topology_problems(spec)
    problems += _kv_role_problems(spec)
    if spec.disaggregated and rel is not None:
        problems += _connector_problems(profile, spec, rel)
    problems += _side_channel_host_problems(spec)
    problems += weights_problems(spec)
    problems += pd_weights_problems(spec)
    for pool, pool_spec in spec.pools.items():
        problems += _pool_problems(spec, pool, pool_spec, rel)
    problems += _gateway_problems(spec)
    plans = rollout_problems(spec.rollout, spec.gateway.stages)
    problems += [Problem(spec.key(path), message) for path, message in plans]
    moves = rebalance_problems(spec.rollout.rebalance, [pool for pool, _ in spec.pools.items()])
    problems += [Problem(spec.key(path), message) for path, message in moves]
    if spec.topology == "same-host":
        pair = HostRuns(instances=[(spec, "prefill"), (spec, "decode")])
        problems += host_problems(profile, pair, where=None)
    return problems


def _served_problems(profile: Profile) -> Iterable[Problem]:
    """Across models: names and aliases are each one model's; a list names aliases per model."""
    if not profile.models:
        return
    names = Counter(spec.name for spec in profile.served)
    owner: dict[str, str] = {}
    for spec in profile.served:
        if names[spec.name] > 1:
            yield Problem(spec.key("name"), f"model name {spec.name!r} is used by {names[spec.name]} models")
        for index, alias in enumerate(spec.aliases):
            if alias in owner and owner[alias] != spec.name:
                yield Problem(
                    spec.key(f"aliases[{index}]"),
                    f"alias {alias!r} is defined twice: by models {owner[alias]!r} and {spec.name!r}",
                )
            owner.setdefault(alias, spec.name)
    if profile.gateway.model_alias is not None:
        yield Problem(
            "gateway.model_alias",
            "a profile with models: names each model's aliases (models[i].aliases); "
            "clear this key (model_alias: null)",
        )


def stage_problem(spec: ServedModel, stage: str) -> str | None:
    """Why a rollout stage cannot be used with this model, or None (for the rollout/gateway code)."""
    if stage not in spec.gateway.stages:
        where = spec.key("gateway.stages")
        return f"{stage!r} is not a stage in {where}; stages: {', '.join(spec.gateway.stages)}"
    return None


# --------------------------------------------------------------------------- profile-only checks


def _version_problems(profile: Profile, version: connectors.Version | None) -> Iterable[Problem]:
    """The pin must be an exact release the facts table has (`vllm_release_data`)."""
    if version is None:
        yield Problem(
            "vllm.version", f"must be an exact vLLM release like {NEWEST} (got {profile.vllm.version!r})"
        )
        return
    if version < connectors.MIN_VLLM:
        yield Problem(
            "vllm.version",
            f"vLLM {profile.vllm.version} is older than pdfleet supports "
            f"(>= {connectors.fmt(connectors.MIN_VLLM)})",
        )
        return
    if find_release(profile.vllm.version, RELEASES) is None:
        yield Problem(
            "vllm.version",
            f"pdfleet has no facts for vLLM {profile.vllm.version} (it knows {', '.join(RELEASES)}); "
            f"pin one of those, or derive the table for it: python -m tools.vllm_facts "
            f"{profile.vllm.version} --write",
        )


def _topology_problems(spec: ServedModel) -> Iterable[Problem]:
    """Which pools a topology runs: colocated alone, or prefill and decode (plus an optional colocated
    baseline pool beside them)."""
    pools = spec.pools
    if spec.topology == "colocated":
        if pools.colocated is None:
            yield Problem(
                spec.key("pools.colocated"),
                "required key is missing: topology colocated runs pools.colocated",
            )
        for pool in ("prefill", "decode"):
            if getattr(pools, pool) is not None:
                yield Problem(
                    spec.key(f"pools.{pool}"),
                    "a colocated profile runs only pools.colocated; "
                    "remove it or use topology same-host/cross-host",
                )
        return
    for pool in ("prefill", "decode"):
        if getattr(pools, pool) is None:
            yield Problem(
                spec.key(f"pools.{pool}"),
                f"required key is missing: topology {spec.topology} runs prefill and decode",
            )
    # pools.colocated beside prefill/decode is the baseline pool the gateway routes between and falls
    # back to during a staged rollout; it runs on the inventory's colocated group.


def _kv_role_problems(spec: ServedModel) -> Iterable[Problem]:
    """prefill is kv_producer, decode kv_consumer, colocated has none; kv_both is never rendered."""
    for pool, pool_spec in spec.pools.items():
        expected = DEFAULT_KV_ROLES[pool]
        where = spec.key(f"pools.{pool}.kv_role")
        if pool_spec.kv_role == expected:
            continue
        if expected is None:
            yield Problem(where, "the colocated pool runs without a KV connector; remove kv_role")
        elif pool_spec.kv_role == "kv_both":
            yield Problem(
                where, f"kv_both is not used: prefill is kv_producer and decode kv_consumer; use {expected}"
            )
        else:
            yield Problem(where, f"must be {expected} for the {pool} pool (got {pool_spec.kv_role})")


SIM_CONNECTORS = (NIXL, MOONCAKE)  # the P/D protocols pdfleet-sim plays (docs/sim.md)


def _connector_problems(profile: Profile, spec: ServedModel, rel: Release) -> Iterable[Problem]:
    """The connector must be real for the pinned vLLM, renderable by pdfleet, and fit the engine."""
    kv = spec.kv_transfer
    problem = connectors.check_connector(kv.connector, rel)
    if problem is not None:
        yield Problem(spec.key("kv_transfer.connector"), problem.message)
        return
    if profile.vllm.engine == "sim" and kv.connector not in SIM_CONNECTORS:
        yield Problem(
            spec.key("kv_transfer.connector"),
            f"the simulator (vllm.engine: sim) speaks {' and '.join(SIM_CONNECTORS)}'s protocols only "
            f"(got {kv.connector})",
        )
    if kv.connector == MOONCAKE and kv.mooncake_protocol == "rdma" and not profile.rdma.enabled:
        yield Problem(
            spec.key("kv_transfer.mooncake_protocol"),
            "rdma needs rdma.enabled: true; enable RDMA or use mooncake_protocol: tcp",
        )


def is_loopback(value: str) -> bool:
    """localhost, 127.0.0.0/8, ::1 or the wildcard: not an address another host can reach."""
    if value.lower() in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


def _side_channel_host_problems(spec: ServedModel) -> Iterable[Problem]:
    """Cross-host NIXL: each prefill host must advertise its own reachable address."""
    kv = spec.kv_transfer
    if spec.topology != "cross-host" or kv.connector != NIXL or kv.side_channel_host == "auto":
        return
    where = spec.key("kv_transfer.side_channel_host")
    if is_loopback(kv.side_channel_host):
        yield Problem(
            where,
            f"{kv.side_channel_host!r} is not reachable from other hosts in a cross-host topology; "
            "use auto (each host's ansible_host)",
        )
    else:
        yield Problem(
            where,
            f"a fixed address ({kv.side_channel_host!r}) would be advertised by every host in a cross-host "
            "topology; use auto (each host's ansible_host)",
        )


def _pool_problems(model: ServedModel, pool: str, spec: PoolSpec, rel: Release | None) -> Iterable[Problem]:
    """Per-pool limits vLLM itself would refuse at start-up, caught before anything is installed; extra_args
    read as the pinned release's parser reads them (no release: as written)."""
    where = model.key(f"pools.{pool}")
    if len(set(spec.gpus)) != len(spec.gpus):
        yield Problem(f"{where}.gpus", f"lists a GPU twice (got {spec.gpus})")
    if len(spec.gpus) != spec.tensor_parallel_size:
        yield Problem(
            f"{where}.gpus",
            f"lists {len(spec.gpus)} GPU(s) but tensor_parallel_size is {spec.tensor_parallel_size}; "
            "an instance uses exactly tensor_parallel_size GPUs",
        )
    if spec.max_num_batched_tokens < spec.max_num_seqs:
        yield Problem(
            f"{where}.max_num_batched_tokens",
            f"must be >= max_num_seqs ({spec.max_num_seqs}) (got {spec.max_num_batched_tokens})",
        )
    max_len = spec.max_model_len or model.model.max_model_len
    if not spec.enable_chunked_prefill and max_len and spec.max_num_batched_tokens < max_len:
        yield Problem(
            f"{where}.max_num_batched_tokens",
            f"must be >= max_model_len ({max_len}) when enable_chunked_prefill is false "
            f"(got {spec.max_num_batched_tokens})",
        )
    for index, arg in enumerate(spec.extra_args):
        flag = arg.split("=", 1)[0]
        written = flag.split(".", 1)[0]  # dotted --kv-transfer-config.kv_role form
        base = managed_flag(arg, rel, MANAGED_FLAGS) if rel else written
        if base is not None and base in MANAGED_FLAGS:
            # an alias, a negative or an abbreviation: say which option vLLM reads it as
            spelled = f" ({base} in vLLM {rel.version})" if rel and base != written else ""
            yield Problem(
                f"{where}.extra_args[{index}]",
                f"{flag}{spelled} is rendered by pdfleet from {MANAGED_FLAGS[base].format(pool=where)}; "
                "set that key instead",
            )


def _gateway_problems(spec: ServedModel) -> Iterable[Problem]:
    """The active stage must be defined, and the long-prompt threshold reachable by some prompt."""
    problem = stage_problem(spec, spec.gateway.stage)
    if problem is not None:
        yield Problem(spec.key("gateway.stage"), problem)
    max_len = spec.model.max_model_len
    threshold = spec.gateway.long_prompt_tokens
    if max_len is not None and threshold >= max_len:
        yield Problem(
            spec.key("gateway.long_prompt_tokens"),
            f"must be < model.max_model_len ({max_len}), or no prompt is ever long (got {threshold})",
        )


def _decider_problems(profile: Profile) -> Iterable[Problem]:
    """A bypass bound needs a P/D pool whose queues it reads; KV events need a tabled release, a colocated
    pool that publishes them and a decider that reads them."""
    decider = profile.gateway.decider
    yield from _cache_source_problems(profile)
    yield from _tokenizer_problems(profile)
    if any(spec.disaggregated for spec in profile.served):
        return
    for key in ("prefill_busy_waiting", "decode_busy_waiting"):
        if getattr(decider, key) is not None:
            yield Problem(
                f"gateway.decider.{key}",
                "no model of this profile has a P/D pool (prefill and decode), so there is no queue to "
                "bound; remove the key",
            )


def _cache_source_problems(profile: Profile) -> Iterable[Problem]:
    """Each model that takes its cache facts from KV events: what it needs (see DeciderSpec.cache_source)."""
    reads = profile.gateway.decider.reads_cache
    for spec in profile.served:
        if spec.gateway.decider.cache_source != "kv_events":
            continue
        key = spec.key("gateway.decider.cache_source")
        if event_format(profile.vllm.version) is None:
            yield Problem(key, f"vLLM {profile.vllm.version}'s KV event format is not tabled; use index")
        elif spec.pools.colocated is None:
            yield Problem(key, "kv_events: the model has no colocated pool whose events the decider reads")
        elif not reads:
            yield Problem(
                key,
                "kv_events: nothing reads the cache facts; set gateway.decider.threshold_on: effective or "
                "gateway.decider.colocated_choice: prefix_load (or remove the key)",
            )


def _tokenizer_problems(profile: Profile) -> Iterable[Problem]:
    """A gateway that runs the model's tokenizer reads the staged revision's files (DeciderSpec.tokenizer):
    the model must be staged, and its engines must load that tokenizer, not another."""
    for spec in profile.served:
        if spec.gateway.decider.tokenizer != "staged":
            continue
        key = spec.key("gateway.decider.tokenizer")
        if not spec.model.staged:
            yield Problem(
                key,
                "staged: the gateway reads the tokenizer of the model's staged revision, and this model is "
                "not staged; set model.source and model.revision (docs/weights.md), or use estimate",
            )
        elif spec.model.tokenizer is not None:
            yield Problem(
                key,
                f"staged: the engines load model.tokenizer ({spec.model.tokenizer}), not the staged "
                "revision's; remove model.tokenizer, or use estimate",
            )


def _key_file_problems(profile: Profile) -> Iterable[Problem]:
    """The client, admin and controller keys must be three files."""
    gw = profile.gateway
    if _control_path(gw.client_key_file) == _control_path(gw.admin_key_file):
        yield Problem(
            "gateway.admin_key_file",
            f"is the same file as gateway.client_key_file ({gw.client_key_file}); the admin key must "
            "differ from the client key (the gateway refuses a keys file holding one key twice)",
        )
    for key in ("client_key_file", "admin_key_file"):
        if _control_path(getattr(gw, key)) == _control_path(gw.controller_key_file):
            yield Problem(
                "gateway.controller_key_file",
                f"is the same file as gateway.{key} ({gw.controller_key_file}); the controller's stage-only "
                "key must be a key of its own",
            )


def _control_path(path: str) -> str:
    """A control-machine path as compared for identity: `~` expanded, `.`/`..`/`//` folded."""
    return os.path.normpath(os.path.expanduser(path))


def _driver_problems(profile: Profile) -> Iterable[Problem]:
    """A pinned driver version must belong to the pinned branch (570.x for branch 570), and the branch must
    exist on some supported platform (on each one the profile names a CUDA repository for)."""
    gpu = profile.gpu
    if gpu.driver_version is not None and gpu.driver_version.split(".", 1)[0] != gpu.driver_branch:
        yield Problem(
            "gpu.driver_version",
            f"{gpu.driver_version} is not in driver_branch {gpu.driver_branch}; "
            f"use a {gpu.driver_branch}.x version or change driver_branch",
        )
    repo = profile.mirrors.cuda_repo
    named = tuple(p for p in PLATFORMS if isinstance(repo, dict) and p.key in repo)
    lacking = [p for p in named or PLATFORMS if gpu.driver_branch not in p.branches]
    if lacking and (named or len(lacking) == len(PLATFORMS)):
        where = ", ".join(p.name for p in lacking)
        yield Problem(
            "gpu.driver_branch",
            f"{gpu.driver_branch} has no driver packages on {where}; branches: {branches_by_platform()}",
        )


def _mirror_problems(profile: Profile) -> Iterable[Problem]:
    """Mirrors are http(s) URLs; a trusted PyPI host only makes sense with a PyPI mirror."""
    mirrors = profile.mirrors
    urls = {"mirrors.apt": mirrors.apt, "mirrors.pypi": mirrors.pypi}
    repo = mirrors.cuda_repo
    urls.update({f"mirrors.cuda_repo.{k}": v for k, v in repo.items()} if isinstance(repo, dict) else {})
    urls.update({"mirrors.cuda_repo": repo} if isinstance(repo, str) else {})
    for key, value in urls.items():
        if value is not None and not value.startswith(("http://", "https://")):
            yield Problem(key, f"must be an http:// or https:// URL (got {value!r})")
    for name in sorted(set(repo) - set(PLATFORM_KEYS)) if isinstance(repo, dict) else ():
        yield Problem(
            f"mirrors.cuda_repo.{name}", f"is not a platform; use one of {', '.join(PLATFORM_KEYS)}"
        )
    if mirrors.pypi_trusted_host is not None and mirrors.pypi is None:
        yield Problem("mirrors.pypi_trusted_host", "is set but mirrors.pypi is not; set both or neither")

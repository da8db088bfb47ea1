"""The `vllm serve` (or `pdfleet-sim serve`) command line for one pool instance, from its model's spec."""

from __future__ import annotations

import json
from typing import Any

from pdfleet.fleet.topology import Instance
from pdfleet.fleet.weights import staged_dir
from pdfleet.hw.kv import kv_connector_extra_config
from pdfleet.model.inventory import Host
from pdfleet.model.profile import Profile
from pdfleet.model.served import ServedModel
from pdfleet.model.vllm_kv_events import event_format
from pdfleet.model.vllm_release_data import RELEASES
from pdfleet.model.vllm_releases import find_release


def kv_transfer_config(profile: Profile, host: Host, inst: Instance) -> dict[str, Any] | None:
    """The --kv-transfer-config object for a P/D instance; None for the colocated pool."""
    if inst.kv_role is None:
        return None
    spec = profile.served_model(inst.model)
    kv = spec.kv_transfer
    config: dict[str, Any] = {
        "kv_connector": kv.connector,
        "kv_role": inst.kv_role,
        "kv_buffer_device": kv.buffer_device,
    }
    if kv.load_failure_policy is not None:
        config["kv_load_failure_policy"] = kv.load_failure_policy
    extra = dict(kv.extra_config)
    # Mooncake's protocol and the host's NICs
    extra.update(kv_connector_extra_config(profile.for_model(spec), host))
    if extra:
        config["kv_connector_extra_config"] = extra
    rel = find_release(profile.vllm.version, RELEASES)
    if rel is not None:  # a key the pin has no field for: refused (0.33) or silently ignored (0.11)
        config = {key: value for key, value in config.items() if key in rel.config_keys()}
    return config


def kv_events_config(profile: Profile, inst: Instance) -> dict[str, Any] | None:
    """The --kv-events-config object of an instance that publishes KV events (None: it publishes none):
    the pinned release's KVEventsConfig keys, the zmq publisher bound on every address at the topology's
    port (vLLM binds only an endpoint with `*`; any other address it connects to), and its replay socket
    (`replay_endpoint`, a ROUTER vLLM binds as given) at the topology's replay port."""
    fmt = event_format(profile.vllm.version)
    if inst.kv_events_port is None or fmt is None:
        return None
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{inst.kv_events_port}",
    }
    if inst.kv_events_replay_port is not None:
        config["replay_endpoint"] = f"tcp://*:{inst.kv_events_replay_port}"
    keys = {key for key, _ in fmt.config}
    return {key: value for key, value in config.items() if key in keys}


def serve_argv(profile: Profile, host: Host, inst: Instance) -> list[str]:
    """argv for the pool's server: the pinned vLLM, or the simulator with the same options."""
    served: ServedModel = profile.served_model(inst.model)
    spec = served.pools.get(inst.pool)
    venv = profile.vllm.venv.rstrip("/")
    model = served.model
    # a staged model loads from its staged directory (the positional model: a local path), vLLM's and the
    # simulator's alike (the simulator reads its config.json and tokenizer, pdfleet.sim.model_dir)
    staged = model.staged
    program = "pdfleet-sim" if profile.vllm.engine == "sim" else "vllm"
    argv = [f"{venv}/bin/{program}", "serve", staged_dir(model) if staged else model.path or model.id]
    argv += [
        "--host",
        inst.address,
        "--port",
        str(inst.port),
        "--served-model-name",
        *served.served_model_names(),
        "--tensor-parallel-size",
        str(spec.tensor_parallel_size),
        "--max-num-batched-tokens",
        str(spec.max_num_batched_tokens),
        "--gpu-memory-utilization",
        str(spec.gpu_memory_utilization),
        "--max-num-seqs",
        str(spec.max_num_seqs),
        "--kv-cache-dtype",
        spec.kv_cache_dtype,
        "--enable-chunked-prefill" if spec.enable_chunked_prefill else "--no-enable-chunked-prefill",
    ]
    max_len = spec.max_model_len or model.max_model_len
    if max_len:
        argv += ["--max-model-len", str(max_len)]
    if model.revision and not staged:  # a local directory is that revision already
        argv += ["--revision", model.revision]
    kv_config = kv_transfer_config(profile, host, inst)
    if kv_config is not None:
        argv += ["--kv-transfer-config", json.dumps(kv_config, separators=(",", ":"), sort_keys=True)]
    events = kv_events_config(profile, inst)
    if events is not None:
        argv += ["--kv-events-config", json.dumps(events, separators=(",", ":"), sort_keys=True)]
    if profile.vllm.engine == "sim":
        sim = profile.vllm.sim
        argv += [
            "--sim-gpu",
            sim.gpu,
            "--sim-link",
            sim.link,
            "--sim-time-scale",
            str(sim.time_scale),
            "--sim-vllm-version",
            profile.vllm.version,
        ]
    argv += list(spec.extra_args)
    return argv

"""Profile checks that depend on the pinned vLLM release, each asked of the facts table.

`release_problems(profile, rel)` yields (key path, message) pairs; `checks.profile_problems` turns them
into Problems. Every rule names what the release does and where in vLLM it comes from (the table row's
source), so the operator sees why a key that worked on one pin fails on another.
"""

from __future__ import annotations

from collections.abc import Iterable

from pdfleet.model.connectors import MOONCAKE, NIXL
from pdfleet.model.profile import Profile
from pdfleet.model.vllm_releases import Release

# Optional --kv-transfer-config keys pdfleet renders, from the profile key beside them.
OPTIONAL_CONFIG_KEYS: dict[str, str] = {"kv_load_failure_policy": "load_failure_policy"}


def release_problems(profile: Profile, rel: Release) -> Iterable[tuple[str, str]]:
    """Every problem of the profile against its pinned release (P/D keys only for P/D profiles)."""
    yield from _chunked_prefill_problems(profile, rel)
    yield from _kv_cache_dtype_problems(profile, rel)
    if not profile.disaggregated:
        return
    yield from _config_key_problems(profile, rel)
    yield from _buffer_device_problems(profile, rel)
    yield from _extra_config_problems(profile, rel)


def _config_key_problems(profile: Profile, rel: Release) -> Iterable[tuple[str, str]]:
    """A --kv-transfer-config key the release has no field for: refused (forbid) or silently ignored."""
    keys = set(rel.config_keys())
    src = rel.kv_transfer_config.source
    for key, attr in OPTIONAL_CONFIG_KEYS.items():
        path = f"kv_transfer.{attr}"
        if getattr(profile.kv_transfer, attr) is not None and key not in keys:
            fate = (
                "refuses it at start"
                if rel.kv_transfer_config.unknown_keys == "forbid"
                else ("ignores it without a word")
            )
            yield (
                path,
                (
                    f"vLLM {rel.version} has no kv_transfer_config.{key} ({src}) and {fate}; "
                    "remove it or pin a release that has it"
                ),
            )


def _buffer_device_problems(profile: Profile, rel: Release) -> Iterable[tuple[str, str]]:
    """kv_buffer_device must be one NixlConnector starts with on CUDA (0.11: cuda only)."""
    kv = profile.kv_transfer
    allowed = rel.buffer_devices_on("cuda")
    if kv.connector == NIXL and kv.buffer_device not in allowed:
        yield (
            "kv_transfer.buffer_device",
            (
                f"vLLM {rel.version}'s NixlConnector fails at start with "
                f"kv_buffer_device {kv.buffer_device!r} "
                f"on CUDA (allowed: {', '.join(allowed)}; {rel.buffer_devices.source})"
            ),
        )


def _extra_config_problems(profile: Profile, rel: Release) -> Iterable[tuple[str, str]]:
    """kv_transfer.extra_config keys the connector of this release never reads (a typo or another era)."""
    kv = profile.kv_transfer
    extra = (
        rel.nixl_extra_config
        if kv.connector == NIXL
        else (rel.mooncake_extra_config if kv.connector == MOONCAKE else None)
    )
    if extra is None:
        return
    known = {k.name for k in extra.keys}
    for key in kv.extra_config:
        if key not in known:
            yield (
                f"kv_transfer.extra_config.{key}",
                (
                    f"{kv.connector} in vLLM {rel.version} reads no kv_connector_extra_config.{key} "
                    f"(it reads {', '.join(sorted(known))})"
                ),
            )


def _chunked_prefill_problems(profile: Profile, rel: Release) -> Iterable[tuple[str, str]]:
    """enable_chunked_prefill: false on a release that forces it back on is a setting that does nothing."""
    if not rel.chunked_prefill.forced_on:
        return
    for pool, spec in profile.pools.items():
        if not spec.enable_chunked_prefill:
            yield (
                f"pools.{pool}.enable_chunked_prefill",
                (
                    f"vLLM {rel.version} forces chunked prefill on for generative models "
                    "whatever the flag says "
                    f"({rel.chunked_prefill.source}); set it true, or pin a release that honours false"
                ),
            )


def _kv_cache_dtype_problems(profile: Profile, rel: Release) -> Iterable[tuple[str, str]]:
    """kv_cache_dtype must be a value the release's `--kv-cache-dtype` takes: argparse choices (0.11) or
    the CacheDType literal its CacheConfig validator checks (0.33, `CacheDType | str`)."""
    flag = rel.serve_flag("--kv-cache-dtype")
    if flag is None or not flag.choices:
        return
    fate = (
        "argparse refuses it (invalid choice)"
        if flag.choices_enforced
        else "its CacheConfig refuses it (Invalid kv_cache_dtype) unless a platform plugin registers it"
    )
    for pool, spec in profile.pools.items():
        if spec.kv_cache_dtype not in flag.choices:
            yield (
                f"pools.{pool}.kv_cache_dtype",
                (
                    f"vLLM {rel.version} fails at start with --kv-cache-dtype {spec.kv_cache_dtype!r}: "
                    f"{fate}; it takes {', '.join(flag.choices)}"
                ),
            )


def managed_flag(arg: str, rel: Release, managed: Iterable[str]) -> str | None:
    """The managed option (one of `managed`) an extra_args word sets in this release's `vllm serve`, as
    its parser reads the word: an alias (`--device-memory-utilization`), a negative (`--disable-x`), or an
    unambiguous abbreviation (`--max-num-batched`, argparse's allow_abbrev); None when it sets none."""
    word = arg.split("=", 1)[0].split(".", 1)[0]  # `--x=v`, and the dotted `--kv-transfer-config.kv_role`
    wanted = set(managed)
    if word in wanted:
        return word
    flag = rel.serve_flag(word)
    if flag is None and rel.serve_flags.allow_abbrev and word.startswith("--"):
        found = {
            f.names
            for g in rel.serve_flags.groups
            for f in g.flags
            if any(n.startswith(word) for n in f.names if n.startswith("--"))
        }
        flag = rel.serve_flag(next(iter(found))[0]) if len(found) == 1 else None
    if flag is None:
        return None
    return next((name for name in flag.names if name in wanted), None)

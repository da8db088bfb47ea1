"""Derive pdfleet's vLLM release facts from vLLM's own wheel and diff them against the committed table.

    .venv/bin/python -m tools.vllm_facts                 # every tabled release: facts + diff
    .venv/bin/python -m tools.vllm_facts 0.34.0 --write  # add a release: regenerate, then review the diff

The wheel is fetched with `pip download --no-deps vllm==X` into a cache (default
~/.cache/pdfleet/vllm-wheels) and read with zipfile: vLLM is never imported, so no torch, no GPU.
Exit status: 0 when every release matches the table, 1 when one differs, 2 on an error.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import subprocess
import sys
from pathlib import Path

from pdfleet.model.vllm_releases import Release, version_key
from tools.vllm_ast import NotConstant, Sources
from tools.vllm_extract import extract

REPO = Path(__file__).resolve().parents[1]
DATA_MODULE = REPO / "pdfleet" / "model" / "vllm_release_data.py"
DEFAULT_CACHE = Path("~/.cache/pdfleet/vllm-wheels")
WIDTH = 110
HEADER = '''"""The vLLM release facts table, written by `python -m tools.vllm_facts --write` from each wheel.

Do not edit by hand: regenerate, and review the script's diff. The row types and the questions asked of
a release are in `pdfleet.model.vllm_releases` (the metric rows in `vllm_metric_rows`); every row names the
vLLM file it was read from.
"""

from __future__ import annotations

'''


class FactsError(Exception):
    """A release that cannot be fetched or read (the message says which and why)."""


def committed_table() -> dict[str, Release]:
    """The committed rows; empty (with a warning) when they no longer load, e.g. after a row type gained
    a field: then --write regenerates every release from its wheel."""
    try:
        from pdfleet.model import vllm_release_data
    except (TypeError, ValueError, AttributeError, ImportError) as exc:
        print(
            f"vllm_facts: the committed table does not load ({exc}); diffing against nothing", file=sys.stderr
        )
        return {}
    return dict(vllm_release_data.RELEASES)


def wheel_for(version: str, cache: Path) -> Path:
    """The cached wheel of a release, downloaded with pip (no dependencies) when absent."""
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob(f"vllm-{version}-*.whl"))
    if not found:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            f"vllm=={version}",
            "-d",
            str(cache),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        found = sorted(cache.glob(f"vllm-{version}-*.whl"))
        if done.returncode != 0 or not found:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no wheel"]
            raise FactsError(f"vllm=={version}: pip download failed: {tail[0]}")
    return found[-1]


def render(value: object, indent: int = 0, used: int = 0) -> str:
    """A table value as Python source that ruff accepts: one line when it fits in WIDTH after the `used`
    characters before it on its line (and a closing comma), else one field or item per line."""
    flat = _flat(value)
    if indent + used + len(flat) + 1 <= WIDTH:
        return flat
    pad = " " * (indent + 4)
    close = f"\n{' ' * indent})"
    if dataclasses.is_dataclass(value):
        parts = [
            f"{pad}{f.name}={render(getattr(value, f.name), indent + 4, len(f.name) + 1)},"
            for f in dataclasses.fields(value)
        ]
        return f"{type(value).__name__}(\n" + "\n".join(parts) + close
    if isinstance(value, tuple):
        return "(\n" + "\n".join(f"{pad}{render(item, indent + 4)}," for item in value) + close
    if isinstance(value, str):
        step = WIDTH - indent - 12
        chunks = [value[i : i + step] for i in range(0, len(value), step)]
        return "(\n" + "\n".join(f"{pad}{_str(chunk)}" for chunk in chunks) + close
    return flat


def _str(text: str) -> str:
    """A string literal as ruff format writes it: double quotes, unless the text holds a double quote."""
    literal = repr(text)
    if literal.startswith("'") and '"' not in text:
        literal = '"' + literal[1:-1].replace("\\'", "'") + '"'
    return literal


def _flat(value: object) -> str:
    """The one-line form of a value."""
    if dataclasses.is_dataclass(value):
        args = ", ".join(f"{f.name}={_flat(getattr(value, f.name))}" for f in dataclasses.fields(value))
        return f"{type(value).__name__}({args})"
    if isinstance(value, tuple):
        items = [_flat(v) for v in value]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    return _str(value) if isinstance(value, str) else repr(value)


def _type_names(value: object, names: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """The row types a value uses, as (module, name) (for the data module's import lines)."""
    if dataclasses.is_dataclass(value):
        names.add((type(value).__module__, type(value).__name__))
        for f in dataclasses.fields(value):
            _type_names(getattr(value, f.name), names)
    elif isinstance(value, tuple):
        for item in value:
            _type_names(item, names)
    return names


def const_name(version: str) -> str:
    """`0.33.0` -> `V0_33_0`, the data module's name for a release."""
    return "V" + version.replace(".", "_")


def module_text(releases: dict[str, Release]) -> str:
    """The whole data module for these releases, oldest first."""
    ordered = sorted(releases.values(), key=lambda r: version_key(r.version))
    names: set[tuple[str, str]] = set()
    for release in ordered:
        _type_names(release, names)
    imports: list[str] = []
    for module in sorted({m for m, _ in names}):
        imports += [
            f"from {module} import (",
            *(f"    {n}," for m, n in sorted(names, key=lambda x: x[1].lower()) if m == module),
            ")",
        ]
    lines = [HEADER + imports[0], *imports[1:], ""]
    for release in ordered:
        lines += [f"{const_name(release.version)} = {render(release)}", "", ""]
    members = ", ".join(const_name(r.version) for r in ordered) + ("," if len(ordered) == 1 else "")
    lines += [
        "# Every tabled release by version, and the newest: the default pin.",
        f"RELEASES: dict[str, Release] = {{r.version: r for r in ({members})}}",
        f'NEWEST = "{ordered[-1].version}"',
        "",
    ]
    return "\n".join(lines)


def summary(release: Release) -> list[str]:
    """One line per row of the table: what a reviewer reads first."""
    r = release
    kind, hold = r.kv_hold_s()
    timing = r.lease_timing()
    beat = f", heartbeat every {r.lease.heartbeat_interval} (+{r.lease.extension})" if timing else ""
    return [
        f"vLLM {r.version}",
        f"  connectors ({r.registry.source}): {', '.join(c.name for c in r.registry.connectors)}",
        f"  kv-transfer-config ({r.kv_transfer_config.source}): {', '.join(r.config_keys())}; "
        f"unknown keys: {r.kv_transfer_config.unknown_keys}",
        f"  side channel ({r.side_channel.source}): VLLM_NIXL_SIDE_CHANNEL_PORT="
        f"{r.env_default('VLLM_NIXL_SIDE_CHANNEL_PORT')}, advertised {r.side_channel.advertised_port}, "
        f"listener {r.side_channel.listener_port}",
        f"  KV hold: {kind} {hold:g} s{beat}",
        f"  buffer devices ({r.buffer_devices.source}): {dict(r.buffer_devices.by_platform)}",
        f"  kv_transfer_params ({r.kv_transfer_params.source}): {', '.join(r.kv_transfer_params.produced)}; "
        f"handed over on {', '.join(r.kv_transfer_params.finish_statuses)}; "
        f"block ids {r.kv_transfer_params.block_ids_type}",
        f"  handshake ({r.handshake.source}): version {r.handshake.connector_version}, "
        f"factors {', '.join(r.handshake.hash_factors) or '(no check)'}; min NIXL {r.handshake.min_nixl}",
        f"  chunked prefill ({r.chunked_prefill.source}): forced on {r.chunked_prefill.forced_on}, "
        f"warning {r.chunked_prefill.disable_warning!r}",
        f"  prefix caching default: {r.prefix_caching.default} (when {r.prefix_caching.when}); "
        f"preempted lookups {'apart' if r.prefix_caching.preempted_apart else 'counted'} "
        f"({r.prefix_caching.stats_source})",
        "  batch defaults (max_num_batched_tokens/max_num_seqs): "
        + "; ".join(
            f">= {t.min_gib} GiB{' not ' + '/'.join(t.excluded) if t.excluded else ''}"
            f" {t.max_num_batched_tokens}/{t.max_num_seqs}"
            for t in r.batch_defaults.tiers
        )
        + f"; max_num_seqs = {r.batch_defaults.max_num_seqs_rule}; --performance-mode "
        + (", ".join(f"{mode} x{factor}" for mode, factor in r.batch_defaults.mode_factors) or "scales none"),
        f"  metrics ({len(r.metrics)}, {sum(m.name.startswith('vllm:nixl_') for m in r.metrics)} nixl): "
        + ", ".join(m.name.removeprefix("vllm:") for m in r.metrics),
        f"  other metric families ({sum(len(o.names) for o in r.other_metrics)}, names only): "
        + ("; ".join(f"{o.source} {len(o.names)}" for o in r.other_metrics) or "none"),
        "  KV Transfer metrics line: "
        + ("; ".join(f"{log.connector} {', '.join(log.keys)}" for log in r.transfer_logs) or "none"),
        "  label values set on start: "
        + "; ".join(
            f"{m.name.removeprefix('vllm:')} {label}={'/'.join(values)}"
            for m in r.metrics
            for label, values in m.label_values
        ),
        f"  vllm serve options ({', '.join(g.source for g in r.serve_flags.groups)}): "
        f"{sum(len(g.flags) for g in r.serve_flags.groups)}, abbreviations "
        f"{'accepted' if r.serve_flags.allow_abbrev else 'refused'} ({r.serve_flags.source})",
        "  mooncake extra config: "
        + (
            ", ".join(f"{k.name}={k.default!r}" for k in r.mooncake_extra_config.keys)
            if r.mooncake_extra_config
            else "(no MooncakeConnector)"
        ),
        "  mooncake protocol: "
        + (
            f"reads {', '.join(r.mooncake_protocol.read)}; bootstrap "
            + ", ".join(f"{method} {path}" for method, path in r.mooncake_protocol.bootstrap_routes)
            + "; "
            + ", ".join(
                f"{name}({', '.join(f for f, _ in fields)})"
                for name, fields in r.mooncake_protocol.bootstrap_schemas
            )
            if r.mooncake_protocol
            else "(no MooncakeConnector)"
        ),
    ]


def diff(committed: Release | None, derived: Release) -> list[str]:
    """The unified diff from the committed row to the derived one (empty when they agree)."""
    old = render(committed).splitlines() if committed else []
    new = render(derived).splitlines()
    names = (f"table {derived.version}", f"wheel {derived.version}")
    return list(difflib.unified_diff(old, new, *names, lineterm=""))


def main(argv: list[str] | None = None) -> int:
    """Derive, print, diff and (with --write) regenerate the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("versions", nargs="*", help="vLLM releases to derive (default: every tabled one)")
    parser.add_argument(
        "--cache",
        type=Path,
        default=DEFAULT_CACHE,
        help=f"where wheels are downloaded and kept (default {DEFAULT_CACHE})",
    )
    parser.add_argument(
        "--write",
        action="store_true",
        help="rewrite the table module with the derived releases (others kept as they are)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=DATA_MODULE,
        help=f"the table module --write rewrites (default {DATA_MODULE.relative_to(REPO)})",
    )
    parser.add_argument("--full", action="store_true", help="print every fact, not only the summary")
    parser.add_argument(
        "--fetch",
        action="store_true",
        help="only download the releases' wheels into --cache (what the wheel-reading tests read), then exit",
    )
    args = parser.parse_args(argv)
    table = committed_table()
    versions = args.versions or sorted(table, key=version_key)
    if not versions:
        print("vllm_facts: no release to derive: name one (the committed table is empty)", file=sys.stderr)
        return 2
    derived: dict[str, Release] = {}
    try:
        for version in versions:
            if not all(part.isdigit() for part in version.split(".")) or version.count(".") != 2:
                raise FactsError(f"{version!r}: give an exact release like 0.33.0")
            wheel = wheel_for(version, args.cache.expanduser())
            if args.fetch:
                print(f"vLLM {version}: {wheel}")
                continue
            try:
                derived[version] = extract(Sources.from_wheel(wheel, version))
            except NotConstant as exc:  # a fact the table's types cannot hold: to review, not to guess
                raise FactsError(f"vLLM {version}: unreadable fact {exc}") from exc
    except (FactsError, KeyError, OSError) as exc:
        print(f"vllm_facts: {exc}", file=sys.stderr)
        return 2
    if args.fetch:
        return 0
    changed = False
    for version, release in derived.items():
        print("\n".join(render(release).splitlines() if args.full else summary(release)))
        lines = diff(table.get(version), release)
        changed = changed or bool(lines)
        print("\n".join(lines) if lines else f"diff against the committed table ({version}): none")
    if args.write:
        args.out.write_text(module_text({**table, **derived}), encoding="utf-8")
        print(f"wrote {args.out}")
        return 0
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())

"""The `pdfleet-sim serve` command line, parsed as `vllm serve` parses it: the option table and argparse.

The options are the pinned release's (`--sim-vllm-version`; the facts table's `serve_flags`, read from
that release's parser code): those the simulator acts on keep vLLM's spelling and default, the rest are
accepted and ignored, anything else is an error with argparse's wording ("unrecognized arguments: --foo",
naming the release and the tabled releases that have it), raised as `ValidationError`. Unambiguous
abbreviations are accepted when the release's parser accepts them (argparse's allow_abbrev). Turning the
parsed options into a validated `SimConfig` is `pdfleet.sim.config`'s job.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any, NoReturn

from pdfleet.errors import ValidationError
from pdfleet.model import catalog
from pdfleet.model.vllm_release_data import NEWEST, RELEASES
from pdfleet.model.vllm_releases import Release, ServeFlag, find_release
from pdfleet.tokens import DEFAULT_CHARS_PER_TOKEN

TIME_SCALE_HELP = (
    "Wall-clock seconds per simulated second (0.1 = ten times faster). Everything the simulator "
    "reports -- Prometheus metrics, log lines, lease timeouts -- is in SIMULATED seconds, i.e. what the "
    "GPU would show; only the pacing of responses is scaled."
)


def _human_int(text: str) -> int:
    """Integers as vLLM accepts them for lengths: plain, or with k/K/m/M suffixes (1k = 1000, 1K = 1024)."""
    mult = {"k": 1000, "m": 1000**2, "K": 1024, "M": 1024**2}
    try:
        if text and text[-1] in mult:
            return int(float(text[:-1]) * mult[text[-1]])
        return int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from exc


# The `vllm serve` options the simulator acts on: the argparse keywords it reads them with, by the name
# the facts table lists them under. Every other option of the pinned release is accepted and ignored.
_HONOURED: dict[str, dict[str, Any]] = {
    "--model": {"dest": "model_opt", "help": "model id or path (alternative to the positional)"},
    "--host": {"default": None, "help": "bind address (default: all interfaces, as vLLM)"},
    "--port": {"type": int, "default": 8000},
    "--served-model-name": {"nargs": "+", "default": None},
    "--api-key": {"nargs": "+", "default": None},
    "--tokenizer": {"default": None, "help": "tokenizer.json file or a directory holding one"},
    "--chat-template": {
        "default": None,
        "help": "chat template file or text (else the tokenizer's)",
    },
    "--tensor-parallel-size": {"type": int, "default": 1},
    "--max-model-len": {"type": _human_int, "default": None},
    "--max-num-seqs": {"type": int, "default": None},
    "--max-num-batched-tokens": {"type": _human_int, "default": None},
    "--gpu-memory-utilization": {"type": float, "default": 0.9},
    "--enable-chunked-prefill": {"default": None},
    "--enable-prefix-caching": {"default": None},
    "--kv-cache-dtype": {"default": "auto"},  # choices: the release's (`_add`)
    "--block-size": {"type": int, "default": catalog.DEFAULT_BLOCK_SIZE},
    "--num-gpu-blocks-override": {"type": int, "default": None},
    "--long-prefill-token-threshold": {"type": int, "default": 0},
    "--kv-transfer-config": {"default": None, "help": "JSON, as vLLM's KVTransferConfig"},
    "--kv-events-config": {"default": None, "help": "JSON, as vLLM's KVEventsConfig (the zmq publisher)"},
    "--disable-log-stats": {"default": False},
    "--performance-mode": {"default": None},  # choices: the release's; throughput scales batch defaults
}


class _Parser(argparse.ArgumentParser):
    """argparse that raises ValidationError instead of exiting, and names the release an unknown option
    was looked up in (and the tabled releases that do have it)."""

    release: Release

    def error(self, message: str) -> NoReturn:
        prefix = "unrecognized arguments: "
        if message.startswith(prefix):
            notes = [_missing(word, self.release) for word in message[len(prefix) :].split()]
            message += "".join(f"\n  {note}" for note in notes if note)
        raise ValidationError(f"pdfleet-sim serve: error: {message}")


class _Switch(argparse.Action):
    """A switch as vLLM registers it: True, or False for its negative names (--no-x; 0.33: --disable-x)."""

    def __init__(
        self, option_strings: Sequence[str], dest: str, negatives: Sequence[str] = (), **kwargs: Any
    ) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)
        self.negatives = tuple(negatives)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, option_string not in self.negatives)


def _missing(word: str, release: Release) -> str | None:
    """What to say about an option the release lacks: which tabled releases have it, if any."""
    name = word.split("=", 1)[0]
    if not name.startswith("-") or release.serve_flag(name) is not None:
        return None
    others = [v for v, rel in RELEASES.items() if rel.serve_flag(name) is not None]
    where = f"; vLLM {', '.join(others)} {'has' if len(others) == 1 else 'have'} it" if others else ""
    return f"vLLM {release.version} has no option {name}{where}"


def release_of(argv: Sequence[str]) -> Release:
    """The release `--sim-vllm-version` names (read first: it decides which options exist)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--sim-vllm-version", default=NEWEST)
    return release_named(pre.parse_known_args(_normalise(argv))[0].sim_vllm_version)


def release_named(version: str) -> Release:
    """The facts-table row a `--sim-vllm-version` names: the exact release (a patch is never its minor)."""
    rel = find_release(version, RELEASES)
    if rel is None:
        raise ValidationError(
            f"--sim-vllm-version {version}: the simulator models vLLM {', '.join(RELEASES)} "
            "(the facts table, pdfleet/model/vllm_release_data.py)"
        )
    return rel


def build_parser(release: Release | None = None) -> argparse.ArgumentParser:
    """The `serve` option parser for a release: its `vllm serve` options (honoured or ignored), with
    its parser's abbreviation rule, and the simulator's own."""
    release = release or RELEASES[NEWEST]
    p = _Parser(
        prog="pdfleet-sim serve",
        allow_abbrev=release.serve_flags.allow_abbrev,
        description="Serve a simulated vLLM OpenAI-compatible API. " + TIME_SCALE_HELP,
    )
    p.release = release
    p.add_argument("model_tag", nargs="?", help="model id or path (as `vllm serve MODEL`)")
    for group in release.serve_flags.groups:
        for flag in group.flags:
            _add(p, flag)
    p.set_defaults(
        **{
            _dest(name, kw): kw.get("default")
            for name, kw in _HONOURED.items()
            if release.serve_flag(name) is None
        }
    )
    sim = p.add_argument_group("simulator")
    sim.add_argument("--sim-gpu", default="H100-SXM", help=f"GPU to simulate: {', '.join(catalog.GPUS)}")
    sim.add_argument(
        "--sim-link",
        default="tcp",
        help=f"link KV blocks travel over (consumer side): {', '.join(catalog.LINKS)}",
    )
    sim.add_argument("--sim-time-scale", type=float, default=1.0, help=TIME_SCALE_HELP)
    sim.add_argument(
        "--sim-vllm-version",
        default=NEWEST,
        help=f"the vLLM release to behave as (its facts table row): {', '.join(RELEASES)}; default {NEWEST}",
    )
    sim.add_argument(
        "--sim-chars-per-token",
        type=float,
        default=DEFAULT_CHARS_PER_TOKEN,
        help="prompt-token estimate without a tokenizer (pdfleet.tokens; the gateway's default)",
    )
    sim.add_argument(
        "--sim-log-interval",
        type=float,
        default=10.0,
        help="simulated seconds between periodic stats/KV-transfer log lines",
    )
    return p


def _add(p: argparse.ArgumentParser, flag: ServeFlag) -> None:
    """One option of the release: with the simulator's meaning when it acts on it, else ignored."""
    name = next((n for n in flag.names if n in _HONOURED), None)
    ignored: dict[str, Any] = {"dest": _ignored_dest(flag.names[0]), "help": argparse.SUPPRESS}
    kwargs = dict(_HONOURED[name]) if name else ignored
    kwargs.setdefault("dest", _dest(flag.names[0], kwargs))
    if name and flag.choices_enforced:  # argparse choices as the release's parser has them
        kwargs["choices"] = [kwargs.get("type", str)(c) for c in flag.choices]
    if flag.nargs == "0":
        kwargs = {k: v for k, v in kwargs.items() if k in ("dest", "default", "help")}
        p.add_argument(*flag.names, action=_Switch, negatives=flag.negatives, **kwargs)
    else:
        if flag.nargs != "1" and "nargs" not in kwargs:
            kwargs["nargs"] = int(flag.nargs) if flag.nargs.isdigit() else flag.nargs
        p.add_argument(*flag.names, **kwargs)


def _dest(name: str, kwargs: dict[str, Any]) -> str:
    return str(kwargs.get("dest") or name.lstrip("-").replace("-", "_"))


def _ignored_dest(flag: str) -> str:
    return "ignored_" + flag.lstrip("-").replace("-", "_")


def _normalise(argv: Sequence[str]) -> list[str]:
    """Drop a leading program path / `serve`, and accept --opt_name like vLLM (underscores → dashes)."""
    words = list(argv)
    if words and os.path.basename(words[0]) in ("pdfleet-sim", "vllm"):
        words = words[1:]
    if words and words[0] == "serve":
        words = words[1:]
    out = []
    for w in words:
        if w.startswith("--") and not w.startswith("---"):
            key, eq, val = w.partition("=")
            w = key.replace("_", "-") + eq + val
        out.append(w)
    return out


def parse_argv(argv: Sequence[str]) -> argparse.Namespace:
    """The `serve` options as the release `--sim-vllm-version` names reads them (a leading program path
    and `serve` are skipped)."""
    return build_parser(release_of(argv)).parse_args(_normalise(argv))

"""The `pdfleet-sim serve` command line, parsed as `vllm serve` parses it: the option table and argparse.

Every `vllm serve` option pdfleet renders is declared with vLLM's spelling and default; the many that do
not affect timing or the API are accepted and ignored; anything else is an error with argparse's
wording ("unrecognized arguments: --foo", no abbreviations), raised as `ValidationError`. Turning the
parsed options into a validated `SimConfig` is `pdfleet.sim.config`'s job.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from pdfleet.errors import ValidationError
from pdfleet.model import catalog
from pdfleet.model.vllm_release_data import NEWEST, RELEASES
from pdfleet.tokens import DEFAULT_CHARS_PER_TOKEN

TIME_SCALE_HELP = (
    "Wall-clock seconds per simulated second (0.1 = ten times faster). Everything the simulator "
    "reports -- Prometheus metrics, log lines, lease timeouts -- is in SIMULATED seconds, i.e. what the "
    "GPU would show; only the pacing of responses is scaled."
)

# vLLM serve options the simulator accepts and ignores (no effect on timing or API), by argument shape.
_IGNORED_VALUE = (
    "--tokenizer-mode",
    "--revision",
    "--code-revision",
    "--tokenizer-revision",
    "--dtype",
    "--seed",
    "--download-dir",
    "--load-format",
    "--config-format",
    "--quantization",
    "--pipeline-parallel-size",
    "-pp",
    "--data-parallel-size",
    "-dp",
    "--data-parallel-size-local",
    "--data-parallel-address",
    "--data-parallel-rpc-port",
    "--data-parallel-start-rank",
    "--data-parallel-backend",
    "--swap-space",
    "--cpu-offload-gb",
    "--max-logprobs",
    "--chat-template",
    "--chat-template-content-format",
    "--response-role",
    "--root-path",
    "--uvicorn-log-level",
    "--ssl-keyfile",
    "--ssl-certfile",
    "--ssl-ca-certs",
    "--ssl-cert-reqs",
    "--max-num-partial-prefills",
    "--max-long-partial-prefills",
    "--scheduling-policy",
    "--distributed-executor-backend",
    "--compilation-config",
    "-O",
    "--generation-config",
    "--override-generation-config",
    "--hf-overrides",
    "--max-lora-rank",
    "--max-loras",
    "--max-cpu-loras",
    "--tool-call-parser",
    "--tool-parser-plugin",
    "--reasoning-parser",
    "--guided-decoding-backend",
    "--structured-outputs-config",
    "--speculative-config",
    "--kv-events-config",
    "--otlp-traces-endpoint",
    "--collect-detailed-traces",
    "--show-hidden-metrics-for-version",
    "--prefix-caching-hash-algo",
    "--max-seq-len-to-capture",
    "--max-parallel-loading-workers",
    "--logits-processor-pattern",
    "--limit-mm-per-prompt",
    "--mm-processor-kwargs",
    "--api-server-count",
    "-asc",
    "--worker-cls",
    "--worker-extension-cls",
    "--model-impl",
    "--max-cudagraph-capture-size",
    "--kv-cache-memory-bytes",
    "--log-config-file",
    "--uds",
    "--tokenizer-pool-size",
    "--max-log-len",
    "--middleware",
    "--lora-dtype",
    "--override-pooler-config",
    "--pooler-config",
    "--task",
    "--runner",
    "--convert",
    "--stream-interval",
    "--mamba-ssm-cache-dtype",
    "--ray-workers-use-nsight",
    "--quantization-param-path",
    "--allowed-local-media-path",
    "--allowed-media-domains",
)
_IGNORED_LIST = (
    "--lora-modules",
    "--prompt-adapters",
    "--allowed-origins",
    "--allowed-methods",
    "--allowed-headers",
    "--cuda-graph-sizes",  # deprecated spelling of --cudagraph-capture-sizes
    "--cudagraph-capture-sizes",
)
_IGNORED_BOOL = (
    "--trust-remote-code",
    "--enforce-eager",
    "--disable-log-requests",
    "--enable-log-requests",
    "--disable-custom-all-reduce",
    "--enable-prefix-caching",
    "--calculate-kv-scales",
    "--disable-frontend-multiprocessing",
    "--enable-auto-tool-choice",
    "--return-tokens-as-token-ids",
    "--disable-fastapi-docs",
    "--enable-prompt-tokens-details",
    "--enable-force-include-usage",
    "--enable-server-load-tracking",
    "--enable-request-id-headers",
    "--enable-expert-parallel",
    "--headless",
    "--disable-sliding-window",
    "--skip-tokenizer-init",
    "--enable-sleep-mode",
    "--disable-mm-preprocessor-cache",
    "--async-scheduling",
    "--enable-lora",
    "--allow-credentials",
    "--disable-uvicorn-access-log",
    "--enable-log-outputs",
    "--fully-sharded-loras",
    "--disable-cascade-attn",
    "--enable-tokenizer-info-endpoint",
    "--enable-dbo",
)


class _Parser(argparse.ArgumentParser):
    """argparse that raises ValidationError instead of exiting, so callers decide what to print."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ValidationError(f"pdfleet-sim serve: error: {message}")


def build_parser() -> argparse.ArgumentParser:
    """The `serve` option parser: vLLM's options (honoured or ignored) and the simulator's own."""
    p = _Parser(
        prog="pdfleet-sim serve",
        allow_abbrev=False,
        description="Serve a simulated vLLM OpenAI-compatible API. " + TIME_SCALE_HELP,
    )
    p.add_argument("model_tag", nargs="?", help="model id or path (as `vllm serve MODEL`)")
    p.add_argument("--model", dest="model_opt", help="model id or path (alternative to the positional)")
    p.add_argument("--host", default=None, help="bind address (default: all interfaces, as vLLM)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--api-key", nargs="+", default=None)
    p.add_argument("--tokenizer", default=None, help="tokenizer.json file or a directory holding one")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--max-model-len", type=_human_int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=_human_int, default=None)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--kv-cache-dtype", default="auto", choices=sorted(catalog.KV_CACHE_DTYPES))
    p.add_argument(
        "--block-size", type=int, default=catalog.DEFAULT_BLOCK_SIZE, choices=[1, 8, 16, 32, 64, 128]
    )
    p.add_argument("--num-gpu-blocks-override", type=int, default=None)
    p.add_argument("--long-prefill-token-threshold", type=int, default=0)
    p.add_argument("--kv-transfer-config", default=None, help="JSON, as vLLM's KVTransferConfig")
    p.add_argument("--disable-log-stats", action=argparse.BooleanOptionalAction, default=False)
    for flag in _IGNORED_VALUE:
        p.add_argument(flag, dest=_ignored_dest(flag), default=None, help=argparse.SUPPRESS)
    for flag in _IGNORED_LIST:
        p.add_argument(flag, dest=_ignored_dest(flag), nargs="*", default=None, help=argparse.SUPPRESS)
    for flag in _IGNORED_BOOL:
        p.add_argument(
            flag,
            dest=_ignored_dest(flag),
            action=argparse.BooleanOptionalAction,
            default=None,
            help=argparse.SUPPRESS,
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


def _ignored_dest(flag: str) -> str:
    return "ignored_" + flag.lstrip("-").replace("-", "_")


def _human_int(text: str) -> int:
    """Integers as vLLM accepts them for lengths: plain, or with k/K/m/M suffixes (1k = 1000, 1K = 1024)."""
    mult = {"k": 1000, "m": 1000**2, "K": 1024, "M": 1024**2}
    try:
        if text and text[-1] in mult:
            return int(float(text[:-1]) * mult[text[-1]])
        return int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from exc


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
    """The `serve` options as argparse reads them (a leading program path and `serve` are skipped)."""
    return build_parser().parse_args(_normalise(argv))

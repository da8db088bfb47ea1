"""`pdfleet-gateway --config PATH`: run the gateway; `--check` validates; `--hash-key` hashes a key."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import logging
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from pdfleet.errors import PdfleetError
from pdfleet.gateway.app import serve
from pdfleet.gateway.keys import hash_key
from pdfleet.gateway.policy import load_policy


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pdfleet-gateway",
        description="One OpenAI-compatible base URL and key in front of the colocated and P/D vLLM pools.",
    )
    p.add_argument("--config", metavar="PATH", help="the gateway policy file (YAML)")
    p.add_argument("--check", action="store_true", help="validate the policy and keys files, then exit")
    p.add_argument(
        "--hash-key",
        action="store_true",
        help="read a client key from stdin and print its SHA-256 digest for the keys file",
    )
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=60.0,
        help="seconds to let in-flight streams finish on SIGTERM (default 60)",
    )
    return p


def _read_key() -> str:
    """The key from stdin (a prompt without echo on a terminal), without its line ending."""
    if sys.stdin.isatty():
        return getpass.getpass("key: ")
    return sys.stdin.readline().rstrip("\r\n")


def main(argv: list[str] | None = None) -> int:
    """Console entry point."""
    args = _parser().parse_args(argv)
    if args.hash_key:
        key = _read_key()
        if not key or key != key.strip():
            print("error: the key is empty or has surrounding whitespace", file=sys.stderr)
            return 2
        print(hash_key(key))
        return 0
    if not args.config:
        print("error: --config PATH is required (the gateway policy file)", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=getattr(logging, args.log_level), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = Path(args.config)
    try:
        policy = load_policy(config)
    except PdfleetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.check:
        spec = policy.spec
        expiry = policy.tls_expiry
        tls_note = "" if expiry is None else f", TLS certificate valid until {expiry:%Y-%m-%d %H:%M} UTC"
        print(
            f"ok: {config}: version {spec.version}, stage {spec.stage}, "
            f"{len(spec.models)} model(s), {len(policy.keys)} key(s){tls_note}"
        )
        return 0
    runner: Callable[[Coroutine[Any, Any, None]], None]
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        runner = asyncio.run
    try:
        runner(serve(config, policy, args.shutdown_timeout))
    except PdfleetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

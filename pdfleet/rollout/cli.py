"""`pdfleet-rollout`: the controller service (`run`) and the commands the operator's `invoke rollout ...`
runs on the monitoring host over SSH (`submit`, `abort`, `promote`, `status`, `history`, `evaluate`).
Every command prints JSON on stdout; errors are one line on stderr and exit 2."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from pdfleet.errors import PdfleetError
from pdfleet.metrics.prometheus import PrometheusClient
from pdfleet.rollout import commands
from pdfleet.rollout.config import DEFAULT_CONFIG, load_config, read_admin_key
from pdfleet.rollout.controller import Controller
from pdfleet.rollout.gateways import GatewayClient
from pdfleet.rollout.store import Store


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pdfleet-rollout", description="Staged, metric-gated rollout of the gateways' stage."
    )
    p.add_argument(
        "--config",
        type=Path,
        default=DEFAULT_CONFIG,
        help=f"the controller's configuration (default {DEFAULT_CONFIG})",
    )
    p.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log level of `run`",
    )
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="run the controller until SIGTERM (the systemd service)")
    s = sub.add_parser("submit", help="start a rollout to a stage")
    s.add_argument("--stage", required=True, help="the target stage (a plan in the profile's rollout.plans)")
    sub.add_parser("abort", help="go back to the last stable stage now")
    pr = sub.add_parser("promote", help="end the current pause (or inconclusive analysis)")
    pr.add_argument("--full", action="store_true", help="skip every remaining step and analysis")
    sub.add_parser("status", help="the live state, as JSON")
    h = sub.add_parser("history", help="the audit log (JSONL)")
    h.add_argument("--last", type=int, default=0, help="only the last N events (0: all)")
    e = sub.add_parser("evaluate", help="dry run: measure the gates a rollout to a stage would use")
    e.add_argument("--stage", required=True, help="the target stage")
    return p


def controller_from(config_path: Path) -> Controller:
    """The controller a configuration file describes (reads the admin key file)."""
    config = load_config(config_path)
    key = read_admin_key(Path(config.admin_key_file))
    return Controller(
        config,
        PrometheusClient(config.prometheus_url, timeout=2.0),
        GatewayClient(key, config.gateway_timeout_s),
        Store(Path(config.state_dir)),
    )


def _run(controller: Controller) -> int:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    logging.getLogger("pdfleet.rollout").info(
        "controlling %d gateway(s), every %g s",
        len(controller.config.gateways),
        controller.config.rollout.interval_s,
    )
    controller.run(stop)
    return 0


def _dispatch(controller: Controller, args: argparse.Namespace) -> Any:
    if args.command == "submit":
        return commands.submit_rollout(controller, args.stage).model_dump()
    if args.command == "abort":
        return commands.flag(controller, "abort").model_dump()
    if args.command == "promote":
        return commands.flag(controller, "promote_full" if args.full else "promote").model_dump()
    if args.command == "status":
        return commands.status(controller)
    if args.command == "evaluate":
        return commands.evaluate(controller, args.stage)
    return None


def main(argv: list[str] | None = None) -> int:
    """Console entry point."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        controller = controller_from(args.config)
        if args.command == "run":
            return _run(controller)
        if args.command == "history":
            for event in controller.store.history(args.last):
                print(json.dumps(event, sort_keys=True))
            return 0
        print(json.dumps(_dispatch(controller, args), sort_keys=True))
    except PdfleetError as exc:
        print(f"error: {str(exc).replace(chr(10), '; ')}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

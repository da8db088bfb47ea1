"""`pdfleet-rollout`: the controller service (`run`: every model's loop) and the commands the operator's
`invoke rollout ...` runs on the monitoring host over SSH (`submit`, `abort`, `promote`, `status`,
`history`, `evaluate`), each of one model (`--model`, needed when the profile serves several). Every
command prints JSON on stdout; errors are one line on stderr and exit 2."""

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
from pdfleet.rollout.config import DEFAULT_CONFIG, load_configs, read_key_file
from pdfleet.rollout.controller import Controller
from pdfleet.rollout.controllers import Controllers
from pdfleet.rollout.gateways import GatewayClient
from pdfleet.rollout.store import Store, migrate_legacy

log = logging.getLogger("pdfleet.rollout")


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
        "--model",
        help="the model a command acts on (a name of the profile's models); needed for submit, abort, "
        "promote and evaluate when there are several; status and history show every model without it",
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


def controllers_from(config_path: Path) -> Controllers:
    """Every model's controller a configuration file describes (reads the stage key file), each with
    its state under state_dir/<model>/; a state from before rollouts went by model (in state_dir
    itself) is moved to the first model's first (store.migrate_legacy)."""
    configs = load_configs(config_path)
    first = configs[0]
    key = read_key_file(Path(first.stage_key_file), "stage key")
    state_dir = Path(first.state_dir)
    if first.name is not None and migrate_legacy(state_dir, first.name):
        log.info("moved the rollout state in %s to %s", state_dir, state_dir / first.name)
    source = PrometheusClient(first.prometheus_url, timeout=2.0)
    gateways = GatewayClient(key, first.gateway_timeout_s, first.gateway_ca_file)
    return Controllers.of(
        [Controller(c, source, gateways, Store(state_dir / (c.name or ""))) for c in configs]
    )


def _run(controllers: Controllers) -> int:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    for c in controllers.models:
        log.info(
            "model %s: controlling %d gateway(s) (%s), every %g s",
            c.config.name,
            len(c.config.gateways),
            f"group {c.config.group}" if c.config.group else "top-level stage",
            c.config.rollout.interval_s,
        )
    controllers.run(stop)
    return 0


def _status(controllers: Controllers, model: str | None) -> dict[str, Any]:
    """Every model's status (or the one named), each with its name; a model with no saved state yet
    says so in its entry when all are shown."""
    if model is not None:
        return {"models": [{"model": model, **commands.status(controllers.named(model))}]}
    docs = []
    for c in controllers.models:
        try:
            docs.append({"model": c.config.name, **commands.status(c)})
        except PdfleetError as exc:
            docs.append({"model": c.config.name, "phase": None, "error": str(exc)})
    return {"models": docs}


def _history(controllers: Controllers, model: str | None, last: int) -> list[dict[str, Any]]:
    """One model's audit log, or every model's merged by time, each event naming its model."""
    chosen = [controllers.named(model)] if model is not None else controllers.models
    events = [{**e, "model": c.config.name} for c in chosen for e in c.store.history()]
    events.sort(key=lambda e: e.get("at") or 0.0)
    return events[-last:] if last > 0 else events


def _dispatch(controllers: Controllers, args: argparse.Namespace) -> Any:
    if args.command == "status":
        return _status(controllers, args.model)
    controller = controllers.named(args.model)
    if args.command == "submit":
        return commands.submit_rollout(controller, args.stage).model_dump()
    if args.command == "abort":
        return commands.flag(controller, "abort").model_dump()
    if args.command == "promote":
        return commands.flag(controller, "promote_full" if args.full else "promote").model_dump()
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
        controllers = controllers_from(args.config)
        if args.command == "run":
            return _run(controllers)
        if args.command == "history":
            for event in _history(controllers, args.model, args.last):
                print(json.dumps(event, sort_keys=True))
            return 0
        print(json.dumps(_dispatch(controllers, args), sort_keys=True))
    except PdfleetError as exc:
        print(f"error: {str(exc).replace(chr(10), '; ')}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""`pdfleet-sim serve MODEL [vllm serve options] [--sim-gpu G] [--sim-link L] [--sim-time-scale X]`.

A vLLM-compatible server without a GPU. Reported durations (metrics, logs) are SIMULATED seconds:
with --sim-time-scale 0.1 everything happens ten times faster in wall time, but
vllm:time_to_first_token_seconds still shows what the simulated GPU would have shown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Sequence

from pdfleet.errors import PdfleetError
from pdfleet.sim.config import SimConfig, parse_serve_args
from pdfleet.sim.serve_options import TIME_SCALE_HELP, build_parser, release_of
from pdfleet.sim.server import SimServer

USAGE = (
    "usage: pdfleet-sim serve MODEL [vllm serve options] [--sim-gpu NAME] [--sim-link NAME] "
    "[--sim-time-scale X]\n\n" + TIME_SCALE_HELP + "\nRun `pdfleet-sim serve --help` for every option.\n"
)


def _setup_logging() -> None:
    """vLLM-like log lines: 'INFO 11-29 20:30:00 [server.py:123] message'."""
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stdout,
        format="%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s",
        datefmt="%m-%d %H:%M:%S",
    )


async def serve(cfg: SimConfig) -> None:
    """Run one simulated instance until SIGTERM/SIGINT."""
    server = SimServer(cfg)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    logging.getLogger("pdfleet.sim").info("Shutting down")
    await server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        sys.stdout.write(USAGE)
        return 0 if args else 2
    if args[0] != "serve":
        sys.stderr.write(f"pdfleet-sim: unknown command {args[0]!r}\n{USAGE}")
        return 2
    try:
        if any(a in ("-h", "--help") for a in args[1:]):
            build_parser(release_of(args[1:])).print_help()  # the options of the pinned release
            return 0
        cfg = parse_serve_args(args[1:])
    except PdfleetError as exc:
        sys.stderr.write(f"{exc}\n")
        return 2
    _setup_logging()
    try:
        import uvloop

        uvloop.run(serve(cfg))
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        asyncio.run(serve(cfg))
    except OSError as exc:
        sys.stderr.write(f"pdfleet-sim: cannot listen: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

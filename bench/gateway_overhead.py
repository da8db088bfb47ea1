"""Gateway overhead benchmark (rerunnable; not a test): `python bench/gateway_overhead.py`.

Measures, in one run on this machine, against one paced SSE upstream (pdfleet.bench.upstream):
- added TTFT: time to first streamed event through the proxy minus direct to the upstream, p50 and p99,
  at 50 and at 500 streams in flight. TTFT counts from the moment the client starts the stream (opens
  a connection, or writes the request on a reused one). The direct baseline runs in the same run, the
  targets interleaved over `--rounds`;
- streamed-chunk throughput: events per second delivered through the proxy with many fast streams,
  and events per CPU-second of the proxy;
for pdfleet-gateway and for nginx as a plain streaming proxy (`proxy_buffering off`, one worker).

Arrivals (`--arrivals`):
- poisson (default): open loop, as independent clients arrive. Stream starts are a Poisson process of
  rate = streams / mean stream length, so that on average `streams` are in flight (Little's law). The
  mean stream length is measured by a short pilot run on the direct target before each concurrency
  level (the nominal first_ms + tokens * gap_ms is ~1-7% short: connect, request handling and the
  upstream's ms-rounded timers), or given with `--stream-ms`. The start times are seeded (and drawn
  conditioned on their count, so a short run is not off the intended load by luck), and every target
  in a run gets the same ones. A start that is due is launched whatever is in flight; each
  start's lateness (began vs due) is reported, so one can see that the client kept up. Starts stop
  at the end of the measured window; in-flight streams then get `--drain` seconds to finish.
- burst: closed loop, stress mode: `streams` workers each run one stream after another, all start
  together and, the streams being equally long, stay in phase: requests come in bursts of 50 or 500.
- staggered: closed loop, periodic: each worker starts at a random offset within one stream length
  and keeps that phase for the whole run (`streams` fixed phases).
Connections (`--connections`): keepalive (default; a client-side pool as the OpenAI SDK's httpx pool
keeps: a stream reuses an idle connection and opens one only when none is idle) or close (a new TCP
connection per stream, `Connection: close`). The tables count the connections the client opened,
which shows whether the proxy kept them alive.

Besides TTFT, each latency row reports the time-average of streams in flight over the measured window,
the CPU that the load client and the upstream used on CPU 0, and the start lateness. The proxies are
pinned to CPU 1 (one core); the upstream and this load client share CPU 0. CPU used meanwhile by
processes outside the bench is measured too, and rows where it exceeds 10% of a CPU get a note.
Proxy core kept awake (`--keep-awake`, the default, latency runs only): this machine is a VM; a vCPU
with nothing to run halts, and waking it again (an IPI through the hypervisor) sometimes takes
milliseconds. Every proxied request crosses to the proxies' core and back, the direct baseline never
does, so those wake-ups land in the added-latency tail of nginx and the gateway alike (seen here:
both at about +4.6 ms p99 over 2900 samples). A SCHED_IDLE spinner on that core keeps it from halting
without taking CPU from the proxies (the scheduler preempts it as soon as a proxy wakes), the VM
analogue of the latency tuning (no deep C-states) a latency-sensitive host gets. `--no-keep-awake`
measures without it. Its CPU time counts neither as the proxy's nor as "other".
TLS (`--tls`): the same comparison with both proxies in HTTPS (one throwaway CA and certificate for
127.0.0.1, made with openssl in the run's temporary directory; TLS 1.2+, each proxy's default suites,
which negotiate TLS 1.3 here), the client verifying the certificate; the direct baseline and the
upstream stay plain, so the added TTFT includes the TLS records (and, with `--connections close`, a
handshake per stream).
Everything listens on 127.0.0.1 and the whole run is bounded in time.
Needs nginx (`apt-get install -y nginx`); without it the nginx rows are skipped with a note.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from pdfleet.bench.gateway_overhead import OverheadConfig, run_all
from pdfleet.bench.gateway_overhead_report import describe, fmt_table, setup_line
from pdfleet.bench.procs import keep_awake, stop_processes
from pdfleet.bench.proxies import TlsFiles, start_targets
from pdfleet.lab import pki


def positive(kind: type):
    """An argparse type: a number > 0."""

    def parse(text: str):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    return parse


def _tls_files(tmp: Path) -> TlsFiles:
    """A throwaway CA and a certificate for 127.0.0.1 it signed, in `tmp` (keys 0600)."""
    ca = pki.make_ca(tmp / "ca")
    pair = pki.issue(ca, tmp / "ca", "proxy", ["localhost"], ["127.0.0.1"])
    return TlsFiles(pair.cert, pair.key, ca.cert)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--concurrency",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[50, 500],
        help="streams in flight for the latency runs: closed-loop workers, or the poisson mode's mean "
        "(default 50,500)",
    )
    p.add_argument(
        "--duration",
        type=positive(float),
        default=16.0,
        help="measured seconds per latency cell, over all rounds (default 16)",
    )
    p.add_argument(
        "--rounds", type=positive(int), default=2, help="interleaved rounds per latency cell (default 2)"
    )
    p.add_argument(
        "--tp-duration",
        type=positive(float),
        default=8.0,
        help="measured seconds per throughput run (default 8)",
    )
    p.add_argument(
        "--warmup",
        type=float,
        default=2.0,
        help="unmeasured seconds before each run (default 2; poisson: at least one mean stream length)",
    )
    p.add_argument("--tokens", type=int, default=64, help="events per latency stream (default 64)")
    p.add_argument("--first-ms", type=float, default=20.0, help="upstream time to first event (default 20)")
    p.add_argument("--gap-ms", type=float, default=25.0, help="upstream gap between events (default 25)")
    p.add_argument("--tp-streams", type=int, default=200, help="streams in the throughput run (default 200)")
    p.add_argument("--tp-tokens", type=int, default=2000, help="events per throughput stream (default 2000)")
    p.add_argument("--tp-gap-ms", type=float, default=1.0, help="gap between events there (default 1)")
    p.add_argument(
        "--arrivals",
        choices=["poisson", "burst", "staggered"],
        default="poisson",
        help="latency runs' load. poisson (default): open loop, stream starts are a Poisson process "
        "with on average --concurrency streams in flight, as independent clients arrive. burst: closed "
        "loop, all streams start at once and stay in phase (stress mode: the last request of a burst "
        "queues behind the others). staggered: closed loop, each worker starts at a random offset "
        "within one stream length and keeps that phase (periodic arrivals)",
    )
    p.add_argument(
        "--connections",
        choices=["keepalive", "close"],
        default="keepalive",
        help="keepalive (default): streams reuse idle connections from a client pool, as the OpenAI "
        "SDK's httpx pool does; close: a new TCP connection per stream (`Connection: close`). "
        "Applies to the latency and the throughput runs",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=1,
        help="poisson: seed of the arrival times (every target in a run sees the same ones; default 1)",
    )
    p.add_argument(
        "--stream-ms",
        type=positive(float),
        help="poisson: mean stream length (ms) that sets the start rate (rate = streams / length); "
        "default: measured by a pilot run on the direct target before each concurrency level",
    )
    p.add_argument(
        "--drain",
        type=positive(float),
        default=10.0,
        help="poisson: seconds in-flight streams get to finish after the last start; any still running "
        "are abandoned and counted failed (default 10)",
    )
    p.add_argument(
        "--keep-awake",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="during the latency runs, keep the proxies' core from halting with a SCHED_IDLE spinner "
        "(default; see above why); --no-keep-awake measures with the VM's idle wake-ups",
    )
    p.add_argument(
        "--tls",
        action="store_true",
        help="both proxies in HTTPS with a throwaway CA (the client verifies it); direct stays plain",
    )
    p.add_argument("--json", type=Path, help="also write the raw results here")
    args = p.parse_args()
    cpus: tuple[int | None, int | None] = (0, 1) if (os.cpu_count() or 1) >= 2 else (None, None)
    if cpus[0] is not None:
        os.sched_setaffinity(0, {cpus[0]})
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))
    cfg = OverheadConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(OverheadConfig)})
    kept_awake = args.keep_awake and cpus[1] is not None
    tmp = Path(tempfile.mkdtemp(prefix="pdfleet-gw-bench-"))
    procs: list[subprocess.Popen] = []
    try:
        targets = start_targets(tmp, cpus, procs, _tls_files(tmp) if args.tls else None)
        spinner = keep_awake(cpus[1]) if kept_awake and cpus[1] is not None else None
        if spinner is not None:
            procs.append(spinner)
            for t in targets:
                t.bench = [*t.bench, spinner.pid]
        import uvloop

        latency, throughput, stream_ms = uvloop.run(run_all(targets, cfg, spinner))
    finally:
        stop_processes(procs)
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    print(setup_line(cfg, cpus, kept_awake) + ("; proxies in HTTPS (--tls)" if args.tls else ""))
    for line in describe(cfg, stream_ms):
        print(line)
    print(fmt_table(latency, throughput))
    if args.json:
        raw = {
            "latency": latency,
            "throughput": throughput,
            "mean_stream_ms": {str(n): {"ms": ms, "how": how} for n, (ms, how) in stream_ms.items()},
            "args": {k: str(v) for k, v in vars(args).items()},
        }
        args.json.write_text(json.dumps(raw, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Gateway overhead benchmark (rerunnable; not a test): `python bench/gateway_overhead.py`.

Measures, in one run on this machine, against one paced SSE upstream (bench/gateway_upstream.py):
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
Everything listens on 127.0.0.1 and the whole run is bounded in time.
Needs nginx (`apt-get install -y nginx`); without it the nginx rows are skipped with a note.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_upstream import Client, Stats, request_bytes  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
KEY = "sk-bench-0123456789"
PATH = "/v1/chat/completions"
LATE_NOTE_MS = 5.0  # start lateness p99 above which the table gets a note
CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pin(cpu: int | None):
    """A preexec_fn pinning a child to one CPU (None: no pinning)."""
    if cpu is None:
        return None
    return lambda: os.sched_setaffinity(0, {cpu})


def wait_http(url: str, timeout: float = 20) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout} s")


def wait_port(port: int, timeout: float = 20) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listening on 127.0.0.1:{port} after {timeout} s")


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of these processes, in seconds."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / CLK_TCK


def busy_cpu_seconds() -> float:
    """CPU seconds all CPUs spent busy (/proc/stat: everything but idle and iowait)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def process_tree(pid: int) -> list[int]:
    """pid and its direct children (nginx: master plus workers)."""
    pids = [pid]
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                pids.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return pids


NGINX_CONF = """
{user}
worker_processes 1;
daemon off;
master_process on;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/body;
  proxy_temp_path {tmp}/proxy;
  fastcgi_temp_path {tmp}/fastcgi;
  uwsgi_temp_path {tmp}/uwsgi;
  scgi_temp_path {tmp}/scgi;
  upstream up {{ server 127.0.0.1:{upstream}; keepalive 1024; }}
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    location / {{
      proxy_pass http://up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_read_timeout 3600s;
    }}
  }}
}}
"""

POLICY = """
version: 1
listen: {{host: 127.0.0.1, port: {port}}}
keys_file: keys.yaml
models:
  bench: {{colocated: ["http://127.0.0.1:{upstream}"]}}
long_prompt_tokens: 8192
stage: colocated-only
stages: {{colocated-only: {{short: 0, long: 0}}}}
log_requests: false
"""


@dataclass
class Target:
    """One thing the client streams through: direct (the upstream itself), nginx or the gateway."""

    name: str
    port: int
    key: str | None
    pids: list[int]  # the proxy's processes (for "direct": the upstream itself)
    upstream: list[int]  # the upstream's process: shares CPU 0 with this client
    bench: list[int] = field(default_factory=list)  # every process this run started (all targets)


NAN = float("nan")


def pct(sorted_xs: list[float], q: float) -> float:
    """The q-quantile of sorted seconds, in ms (nearest rank)."""
    if not sorted_xs:
        return NAN
    return sorted_xs[min(len(sorted_xs) - 1, int(q * (len(sorted_xs) - 1) + 0.5))] * 1000


def client_cpu() -> float:
    """This load client's own CPU seconds (it shares CPU 0 with the upstream)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def measure(target: Target, stats: Stats, warmup: float, duration: float) -> dict[str, float]:
    """Counters over the measured window [warmup, warmup + duration): time, events, CPU seconds."""

    def read() -> tuple[float, ...]:
        return (
            time.perf_counter(),
            stats.events,
            cpu_seconds(target.pids),
            cpu_seconds(target.upstream),
            client_cpu(),
            busy_cpu_seconds() - cpu_seconds(target.bench) - client_cpu(),
        )

    await asyncio.sleep(warmup)
    start = read()
    await asyncio.sleep(duration)
    end = read()
    keys = ("t", "events", "proxy_cpu", "upstream_cpu", "client_cpu", "other_cpu")
    out = {k: e - s for k, s, e in zip(keys, start, end, strict=True)}
    out["t0"], out["t1"] = start[0], end[0]
    return out


def mean_in_flight(spans: list[list[float]], t0: float, t1: float, now: float) -> float:
    """Time-average of streams in flight over [t0, t1]; a stream still running counts until `now`."""
    total = 0.0
    for start, end in spans:
        if start != start:  # NaN: never started (abandoned before its connect)
            continue
        total += max(0.0, min(now if end != end else end, t1) - max(start, t0))
    return total / (t1 - t0)


def summarise(
    target: Target,
    streams: int,
    stats: Stats,
    window: dict[str, float],
    spans: list[list[float]],
    lateness: list[float],
    unfinished: int,
) -> dict:
    """One result row (lists of seconds kept for merge(), which drops them)."""
    now = time.perf_counter()
    ttft = sorted(stats.ttft)
    late = sorted(lateness)
    durations = [e - s for s, e in spans if s == s and e == e]
    secs, cpu = window["t"], window["proxy_cpu"]
    return {
        "ttft": ttft,
        "lateness": late,
        "durations": durations,
        "target": target.name,
        "streams": streams,
        "requests": len(ttft),
        "done": stats.done,
        "failed": stats.failed + unfinished,
        "unfinished": unfinished,
        "connects": stats.connects,
        "stale": stats.stale,
        "window_s": secs,
        "mean_in_flight": mean_in_flight(spans, window["t0"], window["t1"], now),
        "mean_stream_ms": 1000 * sum(durations) / len(durations) if durations else NAN,
        "ttft_p50_ms": pct(ttft, 0.50),
        "ttft_p99_ms": pct(ttft, 0.99),
        "late_p99_ms": pct(late, 0.99),
        "late_max_ms": late[-1] * 1000 if late else NAN,
        "events_per_s": window["events"] / secs,
        "proxy_cpu_s": cpu,
        "events_per_cpu_s": window["events"] / cpu if cpu > 0 else NAN,
        "client_cpu_s": window["client_cpu"],
        "upstream_cpu_s": window["upstream_cpu"],
        "other_cpu_s": window["other_cpu"],  # anything else busy on the machine (kernel threads too)
    }


async def run_closed(
    target: Target, streams: int, duration: float, warmup: float, body: bytes, keepalive: bool, stagger: float
) -> dict:
    """Closed-loop load (burst/staggered): `streams` workers, each running one stream after another.

    With `stagger` > 0 each worker starts after a random delay in [0, stagger) (seeded: the same
    offsets for every target); with 0 they all start at once. Equal-length streams keep either pattern
    in phase for the whole run: bursts of `streams` requests at a time, or `streams` fixed phases.
    """
    stats = Stats()
    client = Client(
        target.port, request_bytes(target.port, PATH, body, target.key, keepalive), stats, keepalive
    )
    rng = random.Random(streams)
    offsets = [rng.uniform(0, stagger) if stagger > 0 else 0.0 for _ in range(streams)]
    warmup = max(warmup, stagger)  # measure only once every worker has started
    t_start = time.perf_counter()
    record_after, deadline = t_start + warmup, t_start + warmup + duration
    spans: list[list[float]] = []

    async def worker(offset: float) -> None:
        if offset:
            await asyncio.sleep(offset)
        while time.perf_counter() < deadline:
            span = [NAN, NAN]
            spans.append(span)
            await client.stream(time.perf_counter() >= record_after, span)

    window = asyncio.ensure_future(measure(target, stats, warmup, duration))
    await asyncio.gather(*(worker(o) for o in offsets))
    client.close()
    return summarise(target, streams, stats, await window, spans, [], 0)


def poisson_starts(rate: float, horizon: float, seed: int) -> list[float]:
    """Start times (s from the run's start) of a Poisson process of `rate`/s over [0, horizon).

    Drawn as a Poisson process conditioned on its count: round(rate * horizon) times, uniform and
    sorted. Gaps are still independent-looking (exponential for large counts), but a short run is
    not ±1/sqrt(count) off the intended load just by the luck of its seed.
    """
    rng = random.Random(seed)
    return sorted(rng.uniform(0, horizon) for _ in range(round(rate * horizon)))


async def run_open(
    target: Target,
    streams: int,
    starts: list[float],
    duration: float,
    warmup: float,
    drain: float,
    body: bytes,
    keepalive: bool,
) -> dict:
    """Open-loop load: a stream starts at each of `starts`, however many are in flight then.

    TTFT is recorded for streams due in the measured window. After the last start, in-flight streams
    get at most `drain` s to finish; any still running are abandoned and counted failed (unfinished).
    Each start's lateness (when its stream began vs when it was due) shows the client kept up.
    """
    stats = Stats()
    client = Client(
        target.port, request_bytes(target.port, PATH, body, target.key, keepalive), stats, keepalive
    )
    begun: list[tuple[float, list[float]]] = []
    tasks: set[asyncio.Task[None]] = set()

    async def one(due: float) -> None:
        span = [NAN, NAN]
        begun.append((due, span))
        await client.stream(due >= warmup, span)

    base = time.perf_counter()
    window = asyncio.ensure_future(measure(target, stats, warmup, duration))
    for due in starts:
        # uvloop timers round to the nearest ms, so a sleep may end early: sleep again until due (never
        # early; late by under ~1 ms, reported). Padding the sleep instead doubles the lateness, and
        # sleeping short to spin the last ms costs ~10% of CPU 0 at 300 starts/s.
        while (left := due - (time.perf_counter() - base)) > 0:
            await asyncio.sleep(left)
        task = asyncio.create_task(one(due))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    win = await window
    pending: set[asyncio.Task[None]] = set()
    if tasks:
        _, pending = await asyncio.wait(set(tasks), timeout=drain)
    for task in pending:
        task.cancel()
    client.close()
    lateness = [span[0] - base - due for due, span in begun if span[0] == span[0]]
    return summarise(target, streams, stats, win, [span for _, span in begun], lateness, len(pending))


def latency_body(tokens: int, first_ms: float, gap_ms: float) -> bytes:
    return json.dumps(
        {
            "model": "bench",
            "messages": [
                {"role": "user", "content": "Summarise the attached report in three bullet points."}
            ],
            "stream": True,
            "max_tokens": tokens,
            "bench": {"first_ms": first_ms, "gap_ms": gap_ms},
        }
    ).encode()


def start_processes(
    tmp: Path, cpus: tuple[int | None, int | None]
) -> tuple[list[subprocess.Popen], list[Target]]:
    """Upstream (CPU 0), nginx and the gateway (CPU 1); returns the processes and the targets."""
    procs: list[subprocess.Popen] = []
    up_port, ng_port, gw_port = free_port(), free_port(), free_port()
    up = subprocess.Popen(
        [sys.executable, str(REPO / "bench" / "gateway_upstream.py"), "--port", str(up_port)],
        preexec_fn=pin(cpus[0]),
        stdout=subprocess.DEVNULL,
    )
    procs.append(up)
    wait_port(up_port)
    targets = [Target("direct", up_port, None, [up.pid], [up.pid])]

    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if nginx:
        user = "user root;" if os.geteuid() == 0 else ""
        (tmp / "nginx.conf").write_text(NGINX_CONF.format(user=user, tmp=tmp, upstream=up_port, port=ng_port))
        ng = subprocess.Popen(
            [nginx, "-p", str(tmp), "-c", str(tmp / "nginx.conf")],
            preexec_fn=pin(cpus[1]),
            stderr=subprocess.DEVNULL,
        )
        procs.append(ng)
        wait_port(ng_port)
        time.sleep(0.3)
        targets.append(Target("nginx", ng_port, None, process_tree(ng.pid), [up.pid]))
    else:
        print("note: nginx not found; install it with `apt-get install -y nginx` for the comparison rows")

    from pdfleet.gateway.keys import hash_key

    keys = tmp / "keys.yaml"
    keys.write_text(f"keys:\n  - name: bench\n    sha256: {hash_key(KEY)}\n")
    os.chmod(keys, 0o600)
    (tmp / "policy.yaml").write_text(POLICY.format(port=gw_port, upstream=up_port))
    gw = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pdfleet.gateway.cli",
            "--config",
            str(tmp / "policy.yaml"),
            "--log-level",
            "WARNING",
        ],
        preexec_fn=pin(cpus[1]),
    )
    procs.append(gw)
    wait_http(f"http://127.0.0.1:{gw_port}/health")
    targets.append(Target("gateway", gw_port, KEY, [gw.pid], [up.pid]))
    every = sorted({pid for t in targets for pid in t.pids})
    for t in targets:
        t.bench = every
    return procs, targets


_SPIN = "import os\nos.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\nwhile True: pass\n"


def keep_awake(cpu: int) -> subprocess.Popen:
    """A lowest-priority busy loop pinned to `cpu`, so the VM never halts that vCPU (see the docstring)."""
    return subprocess.Popen([sys.executable, "-c", _SPIN], preexec_fn=pin(cpu))


def describe(args: argparse.Namespace, stream_ms: dict[int, tuple[float, str]]) -> list[str]:
    """Lines stating the arrival model and connection mode of the latency table."""
    if args.arrivals == "poisson":
        rates = "; ".join(
            f"{n} streams: {n / (ms / 1000):.1f} starts/s = {n} / {ms:.0f} ms mean stream ({how})"
            for n, (ms, how) in stream_ms.items()
        )
        arrivals = (
            "poisson (open loop: stream starts are a seeded Poisson process, the same for every target; "
            f"rate = streams / mean stream length, Little's law; seed {args.seed}): {rates}"
        )
    elif args.arrivals == "burst":
        arrivals = "burst (closed loop, stress mode: all streams start together and stay in phase)"
    else:
        arrivals = "staggered (closed loop, periodic: each worker keeps a fixed random phase)"
    conns = (
        "keepalive (client pool: a stream reuses an idle connection, opens one only when none is idle)"
        if args.connections == "keepalive"
        else "close (a new TCP connection per stream, `Connection: close`)"
    )
    return [f"arrivals: {arrivals}", f"connections: {conns}"]


def fmt_latency(latency: list[dict]) -> list[str]:
    """The latency table: TTFT through each target, what the proxies add, and what the bench cost."""
    out = [
        "| streams | target | requests | failed | mean in-flight | connects | TTFT p50 ms | TTFT p99 ms |"
        " added p50 ms | added p99 ms | proxy CPU % | CPU 0 % (client+upstream) | start late p99 / max ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in latency:
        base = next(r for r in latency if r["streams"] == row["streams"] and r["target"] == "direct")
        added = row["target"] != "direct"
        secs = row["window_s"]
        cpu0 = 100 * (row["client_cpu_s"] + row["upstream_cpu_s"]) / secs
        late = (
            f"{row['late_p99_ms']:.2f} / {row['late_max_ms']:.2f}"
            if row["late_max_ms"] == row["late_max_ms"]
            else "-"
        )
        out.append(
            f"| {row['streams']} | {row['target']} | {row['requests']} | {row['failed']} | "
            f"{row['mean_in_flight']:.1f} | {row['connects']} | "
            f"{row['ttft_p50_ms']:.2f} | {row['ttft_p99_ms']:.2f} | "
            + (
                f"{row['ttft_p50_ms'] - base['ttft_p50_ms']:+.2f} | "
                f"{row['ttft_p99_ms'] - base['ttft_p99_ms']:+.2f} | "
                f"{100 * row['proxy_cpu_s'] / secs:.0f}"
                if added
                else "- | - | -"
            )
            + f" | {cpu0:.0f} | {late} |"
        )
    return out


def fmt_table(latency: list[dict], throughput: list[dict]) -> str:
    """The markdown tables for the report."""
    out = fmt_latency(latency) + [
        "",
        "| target | streams | events/s delivered | proxy CPU s | events per proxy CPU-s | vs nginx |",
        "|---|---|---|---|---|---|",
    ]
    ng = next((r for r in throughput if r["target"] == "nginx"), None)
    for row in throughput:
        rel = (
            f"{100 * row['events_per_s'] / ng['events_per_s']:.0f}% delivered, "
            f"{100 * row['events_per_cpu_s'] / ng['events_per_cpu_s']:.0f}% per CPU-s"
            if ng and row["target"] == "gateway"
            else "-"
        )
        out.append(
            f"| {row['target']} | {row['streams']} | {row['events_per_s']:.0f} | {row['proxy_cpu_s']:.2f} | "
            f"{row['events_per_cpu_s']:.0f} | {rel} |"
        )
    late = [
        f"{r['target']} at {r['streams']} streams: p99 {r['late_p99_ms']:.1f} ms"
        for r in latency
        if r["late_p99_ms"] > LATE_NOTE_MS
    ]
    if late:
        out += [
            "",
            "note: the load client started streams late (timer granularity alone is ~1 ms): "
            + "; ".join(late)
            + ". There the client (CPU 0), not the proxy, may be what limits the load.",
        ]
    busy = [
        f"{r['target']} at {r['streams']} streams: {100 * r['other_cpu_s'] / r['window_s']:.0f}%"
        for r in latency + throughput
        if r["other_cpu_s"] > 0.1 * r["window_s"]
    ]
    if busy:
        out += [
            "",
            "note: other processes kept the machine busy during some measured windows (% of one CPU): "
            + "; ".join(busy)
            + ". Those rows may be disturbed; rerun on a quiet machine.",
        ]
    return "\n".join(out)


def merge(rows: list[dict]) -> dict:
    """One row from several rounds of the same (target, streams): pooled samples, summed counts."""
    ttft = sorted(x for r in rows for x in r["ttft"])
    late = sorted(x for r in rows for x in r["lateness"])
    durations = [x for r in rows for x in r["durations"]]
    out: dict = {k: rows[0][k] for k in ("target", "streams")}
    for k in (
        "requests",
        "done",
        "failed",
        "unfinished",
        "connects",
        "stale",
        "proxy_cpu_s",
        "window_s",
        "client_cpu_s",
        "upstream_cpu_s",
        "other_cpu_s",
    ):
        out[k] = sum(r[k] for r in rows)
    out["ttft_p50_ms"], out["ttft_p99_ms"] = pct(ttft, 0.50), pct(ttft, 0.99)
    out["late_p99_ms"], out["late_max_ms"] = pct(late, 0.99), (late[-1] * 1000 if late else NAN)
    out["mean_stream_ms"] = 1000 * sum(durations) / len(durations) if durations else NAN
    for k in ("events_per_s", "mean_in_flight"):
        out[k] = sum(r[k] * r["window_s"] for r in rows) / out["window_s"]
    out["events_per_cpu_s"] = sum(r["events_per_cpu_s"] * r["proxy_cpu_s"] for r in rows) / max(
        out["proxy_cpu_s"], 1e-9
    )
    return out


async def mean_stream_s(direct: Target, streams: int, body: bytes, args: argparse.Namespace) -> float:
    """Mean stream length measured on `direct`: a pilot open-loop run at the nominal rate.

    Nominal = first_ms + tokens * gap_ms; the real length is longer by the connect, the request
    handling and the upstream timers' slip (each of the `tokens` gaps is a separate ms-rounded timer).
    """
    nominal = (args.first_ms + args.tokens * args.gap_ms) / 1000
    starts = poisson_starts(streams / nominal, nominal, args.seed - 1)
    keepalive = args.connections == "keepalive"
    row = await run_open(direct, streams, starts, nominal, 0.0, args.drain, body, keepalive)
    if not row["durations"]:
        raise RuntimeError(f"pilot run on direct finished no stream (failed={row['failed']})")
    return row["mean_stream_ms"] / 1000


async def run_latency(
    targets: list[Target], streams: int, body: bytes, args: argparse.Namespace, stream_ms: dict
) -> list[dict]:
    """One concurrency level: targets interleaved, `rounds` times, samples pooled per target."""
    keepalive = args.connections == "keepalive"
    per_round = args.duration / args.rounds
    rows: dict[str, list[dict]] = {t.name: [] for t in targets}
    if args.arrivals == "poisson":
        if args.stream_ms:
            mean_s, how = args.stream_ms / 1000, "given by --stream-ms"
        else:
            mean_s, how = await mean_stream_s(targets[0], streams, body, args), "measured on direct"
        stream_ms[streams] = (mean_s * 1000, how)
        warmup = max(args.warmup, mean_s)  # in flight reaches its steady level after one stream length
        for r in range(args.rounds):
            starts = poisson_starts(
                streams / mean_s, warmup + per_round, args.seed * 1_000_003 + streams * 101 + r
            )
            for t in targets:
                rows[t.name].append(
                    await run_open(t, streams, starts, per_round, warmup, args.drain, body, keepalive)
                )
    else:
        # one stream's length: staggered starts spread over it keep arrivals spread in the closed loop
        stagger = (args.first_ms + args.tokens * args.gap_ms) / 1000 if args.arrivals == "staggered" else 0.0
        for _ in range(args.rounds):
            for t in targets:
                rows[t.name].append(
                    await run_closed(t, streams, per_round, args.warmup, body, keepalive, stagger)
                )
    out = []
    for t in targets:
        row = merge(rows[t.name])
        print(
            f"latency {t.name:8s} streams={streams:4d} p50={row['ttft_p50_ms']:.2f} "
            f"p99={row['ttft_p99_ms']:.2f} ms requests={row['requests']} failed={row['failed']} "
            f"in-flight={row['mean_in_flight']:.1f} connects={row['connects']} stale={row['stale']} "
            f"start-late p99/max={row['late_p99_ms']:.2f}/{row['late_max_ms']:.2f} ms",
            flush=True,
        )
        out.append(row)
    return out


async def run_all(
    targets: list[Target], args: argparse.Namespace, spinner: subprocess.Popen | None
) -> tuple[list[dict], list[dict], dict[int, tuple[float, str]]]:
    """Latency runs per concurrency level (with the spinner, if any), then throughput runs (closed
    loop, all streams at once; the spinner stopped first)."""
    latency: list[dict] = []
    stream_ms: dict[int, tuple[float, str]] = {}
    body = latency_body(args.tokens, args.first_ms, args.gap_ms)
    for streams in args.concurrency:
        latency += await run_latency(targets, streams, body, args, stream_ms)
    if spinner is not None:
        spinner.kill()
        spinner.wait()
    throughput: list[dict] = []
    fast = latency_body(args.tp_tokens, 1, args.tp_gap_ms)
    keepalive = args.connections == "keepalive"
    for t in targets:
        row = merge(
            [await run_closed(t, args.tp_streams, args.tp_duration, args.warmup, fast, keepalive, 0.0)]
        )
        print(
            f"throughput {t.name:8s} events/s={row['events_per_s']:.0f} "
            f"events/cpu-s={row['events_per_cpu_s']:.0f} failed={row['failed']}",
            flush=True,
        )
        throughput.append(row)
    return latency, throughput, stream_ms


def positive(kind: type):
    """An argparse type: a number > 0."""

    def parse(text: str):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    return parse


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
    p.add_argument("--json", type=Path, help="also write the raw results here")
    args = p.parse_args()
    cpus: tuple[int | None, int | None] = (0, 1) if (os.cpu_count() or 1) >= 2 else (None, None)
    if cpus[0] is not None:
        os.sched_setaffinity(0, {cpus[0]})
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))
    tmp = Path(tempfile.mkdtemp(prefix="pdfleet-gw-bench-"))
    procs: list[subprocess.Popen] = []
    try:
        procs, targets = start_processes(tmp, cpus)
        spinner = keep_awake(cpus[1]) if args.keep_awake and cpus[1] is not None else None
        if spinner is not None:
            procs.append(spinner)
            for t in targets:
                t.bench = [*t.bench, spinner.pid]
        import uvloop

        latency, throughput, stream_ms = uvloop.run(run_all(targets, args, spinner))
    finally:
        for proc in reversed(procs):
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    print(
        f"cpu pinning: proxies on CPU {cpus[1]}, upstream + client on CPU {cpus[0]}; "
        f"{args.tokens} events/stream, first event after {args.first_ms} ms, then every {args.gap_ms} ms; "
        + (
            f"proxies' core kept awake during the latency runs (SCHED_IDLE spinner on CPU {cpus[1]})"
            if args.keep_awake and cpus[1] is not None
            else "proxies' core not kept awake (--no-keep-awake)"
        )
    )
    for line in describe(args, stream_ms):
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

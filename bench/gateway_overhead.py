"""Gateway overhead benchmark (rerunnable; not a test): `python bench/gateway_overhead.py`.

Measures, in one run on this machine, against one paced SSE upstream (bench/gateway_upstream.py):
- added TTFT: time to first streamed event through the proxy minus direct to the upstream, p50 and p99,
  at 50 and at 500 concurrent streams (closed loop: each stream is followed by the next). With
  `--arrivals burst` (the default) all streams start together and stay in phase, so requests come in
  bursts of 50 or 500 at once (a worst case: the last of a burst queues behind the others' request
  handling); `--arrivals staggered` starts each stream at a random offset, as independent clients do.
  Every target sees the same arrivals (seeded offsets) and the direct baseline runs in the same run;
- streamed-chunk throughput: events per second delivered through the proxy with many fast streams,
  and events per CPU-second of the proxy;
for pdfleet-gateway and for nginx as a plain streaming proxy (`proxy_buffering off`, one worker).
Both proxies are pinned to CPU 1 (one core); the upstream and this load client share CPU 0.
Everything listens on 127.0.0.1 and the whole run is bounded in time.
Needs nginx (`apt-get install -y nginx`); without it the nginx rows are skipped with a note.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_upstream import Stats, one_stream, request_bytes  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
KEY = "sk-bench-0123456789"
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
    name: str
    port: int
    key: str | None
    pids: list[int]


async def run_load(
    target: Target, streams: int, duration: float, warmup: float, body: bytes, stagger: float = 0.0
) -> dict:
    """Closed-loop load: `streams` workers, each running one stream after another.

    With `stagger` > 0 each worker starts after a random delay in [0, stagger) (seeded: the same
    offsets for every target), so streams arrive spread out as independent clients do; with 0 they
    all start at once and stay roughly in phase (bursts of `streams` requests at a time).
    """
    req = request_bytes(target.port, "/v1/chat/completions", body, target.key)
    rng = random.Random(streams)
    offsets = [rng.uniform(0, stagger) if stagger > 0 else 0.0 for _ in range(streams)]
    warmup = max(warmup, stagger)  # measure only once every worker has started
    stats = Stats()
    t_start = time.perf_counter()
    record_after, deadline = t_start + warmup, t_start + warmup + duration
    window: dict[str, float] = {}

    async def worker(offset: float) -> None:
        if offset:
            await asyncio.sleep(offset)
        while time.perf_counter() < deadline:
            await one_stream(target.port, req, stats, time.perf_counter() >= record_after)

    async def sampler() -> None:
        await asyncio.sleep(warmup)
        window["e0"], window["c0"], window["t0"] = stats.events, cpu_seconds(target.pids), time.perf_counter()
        await asyncio.sleep(duration)
        window["e1"], window["c1"], window["t1"] = stats.events, cpu_seconds(target.pids), time.perf_counter()

    await asyncio.gather(sampler(), *(worker(o) for o in offsets))
    secs = window["t1"] - window["t0"]
    cpu = window["c1"] - window["c0"]
    ttft = sorted(stats.ttft)

    def pct(q: float) -> float:
        return ttft[min(len(ttft) - 1, int(q * (len(ttft) - 1) + 0.5))] * 1000 if ttft else float("nan")

    events = window["e1"] - window["e0"]
    return {
        "ttft": ttft,  # seconds, sorted (merge() pools these; not written to the JSON)
        "window_s": secs,
        "target": target.name,
        "streams": streams,
        "requests": len(ttft),
        "done": stats.done,
        "failed": stats.failed,
        "ttft_p50_ms": pct(0.50),
        "ttft_p99_ms": pct(0.99),
        "events_per_s": events / secs,
        "proxy_cpu_s": cpu,
        "events_per_cpu_s": events / cpu if cpu > 0 else float("nan"),
    }


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
    targets = [Target("direct", up_port, None, [up.pid])]

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
        targets.append(Target("nginx", ng_port, None, process_tree(ng.pid)))
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
    targets.append(Target("gateway", gw_port, KEY, [gw.pid]))
    return procs, targets


def fmt_table(latency: list[dict], throughput: list[dict]) -> str:
    """The markdown tables for the report."""
    out = [
        "| streams | target | requests | failed | TTFT p50 ms | TTFT p99 ms | added p50 ms | added p99 ms |"
        " proxy CPU % |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in latency:
        base = next(r for r in latency if r["streams"] == row["streams"] and r["target"] == "direct")
        added = row["target"] != "direct"
        cpu_pct = 100 * row["proxy_cpu_s"] / row["window_s"]
        out.append(
            f"| {row['streams']} | {row['target']} | {row['requests']} | {row['failed']} | "
            f"{row['ttft_p50_ms']:.2f} | {row['ttft_p99_ms']:.2f} | "
            + (
                f"{row['ttft_p50_ms'] - base['ttft_p50_ms']:+.2f} | "
                f"{row['ttft_p99_ms'] - base['ttft_p99_ms']:+.2f}"
                if added
                else "- | -"
            )
            + (f" | {cpu_pct:.0f} |" if added else " | - |")
        )
    out += [
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
    return "\n".join(out)


def merge(rows: list[dict]) -> dict:
    """One row from several rounds of the same (target, streams): pooled TTFTs, summed counts."""
    ttft = sorted(x for r in rows for x in r["ttft"])

    def pct(q: float) -> float:
        return ttft[min(len(ttft) - 1, int(q * (len(ttft) - 1) + 0.5))] * 1000 if ttft else float("nan")

    out: dict = {k: rows[0][k] for k in ("target", "streams")}
    for k in ("requests", "done", "failed", "proxy_cpu_s", "window_s"):
        out[k] = sum(r[k] for r in rows)
    out["ttft_p50_ms"], out["ttft_p99_ms"] = pct(0.50), pct(0.99)
    out["events_per_s"] = sum(r["events_per_s"] * r["window_s"] for r in rows) / out["window_s"]
    out["events_per_cpu_s"] = sum(r["events_per_cpu_s"] * r["proxy_cpu_s"] for r in rows) / max(
        out["proxy_cpu_s"], 1e-9
    )
    return out


async def run_all(targets: list[Target], args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    """Latency runs (targets interleaved, `rounds` times, TTFTs pooled), then throughput runs."""
    latency: list[dict] = []
    body = latency_body(args.tokens, args.first_ms, args.gap_ms)
    # one stream's length: staggered starts spread over it keep arrivals spread in the closed loop
    stagger = (args.first_ms + args.tokens * args.gap_ms) / 1000 if args.arrivals == "staggered" else 0.0
    for streams in args.concurrency:
        rows: dict[str, list[dict]] = {t.name: [] for t in targets}
        for _ in range(args.rounds):
            for t in targets:
                rows[t.name].append(
                    await run_load(t, streams, args.duration / args.rounds, args.warmup, body, stagger)
                )
        for t in targets:
            row = merge(rows[t.name])
            print(
                f"latency {t.name:8s} streams={streams:4d} p50={row['ttft_p50_ms']:.2f} "
                f"p99={row['ttft_p99_ms']:.2f} ms requests={row['requests']} failed={row['failed']}",
                flush=True,
            )
            latency.append(row)
    throughput: list[dict] = []
    fast = latency_body(args.tp_tokens, 1, args.tp_gap_ms)
    for t in targets:
        row = merge([await run_load(t, args.tp_streams, args.tp_duration, args.warmup, fast)])
        print(
            f"throughput {t.name:8s} events/s={row['events_per_s']:.0f} "
            f"events/cpu-s={row['events_per_cpu_s']:.0f}",
            flush=True,
        )
        throughput.append(row)
    return latency, throughput


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--concurrency",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[50, 500],
        help="concurrent streams for the latency runs (default 50,500)",
    )
    p.add_argument(
        "--duration",
        type=float,
        default=16.0,
        help="measured seconds per latency cell, over all rounds (default 16)",
    )
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds per latency cell (default 2)")
    p.add_argument(
        "--tp-duration", type=float, default=8.0, help="measured seconds per throughput run (default 8)"
    )
    p.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each run (default 2)")
    p.add_argument("--tokens", type=int, default=64, help="events per latency stream (default 64)")
    p.add_argument("--first-ms", type=float, default=20.0, help="upstream time to first event (default 20)")
    p.add_argument("--gap-ms", type=float, default=25.0, help="upstream gap between events (default 25)")
    p.add_argument("--tp-streams", type=int, default=200, help="streams in the throughput run (default 200)")
    p.add_argument("--tp-tokens", type=int, default=2000, help="events per throughput stream (default 2000)")
    p.add_argument("--tp-gap-ms", type=float, default=1.0, help="gap between events there (default 1)")
    p.add_argument(
        "--arrivals",
        choices=["burst", "staggered"],
        default="burst",
        help="latency runs: all streams start at once and stay in phase (burst, the default), or start "
        "at random offsets over one stream's length (staggered, like independent clients)",
    )
    p.add_argument("--json", type=Path, help="also write the raw results here")
    args = p.parse_args()
    cpus: tuple[int | None, int | None] = (0, 1) if (os.cpu_count() or 1) >= 2 else (None, None)
    if cpus[0] is not None:
        os.sched_setaffinity(0, {cpus[0]})
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))
    tmp = Path(tempfile.mkdtemp(prefix="pdfleet-gw-bench-"))
    procs: list[subprocess.Popen] = []
    try:
        procs, targets = start_processes(tmp, cpus)
        import uvloop

        latency, throughput = uvloop.run(run_all(targets, args))
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
        f"arrivals: {args.arrivals}"
    )
    print(fmt_table(latency, throughput))
    if args.json:
        raw = {
            "latency": latency,
            "throughput": throughput,
            "args": {k: str(v) for k, v in vars(args).items()},
        }
        args.json.write_text(json.dumps(raw, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

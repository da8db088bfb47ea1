"""The gateway-overhead benchmark's targets on loopback: the paced upstream direct, nginx and pdfleet-gateway.

nginx runs as a plain streaming proxy (`proxy_buffering off`, one worker, keep-alive to the upstream),
pdfleet-gateway with a one-pool policy in front of the same upstream (`pdfleet.bench.upstream`). The
proxies share one CPU, the upstream and the load client another, so that each side's CPU is measurable.
With `TlsFiles`, both proxies listen in HTTPS with the same certificate (TLS 1.2+; the upstream stays
plain, as a gateway's pools are), and their targets carry the client context that verifies it.
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from pdfleet.bench.cpu import busy_cpu_seconds, cpu_seconds, own_cpu_seconds, process_tree
from pdfleet.bench.procs import free_port, pin, wait_http, wait_port
from pdfleet.gateway.keys import hash_key
from pdfleet.gateway.policy import policy_text, write_policy
from pdfleet.gateway.tls import client_context

KEY = "sk-bench-0123456789"  # the gateway's client key (the benchmark's own, hashed into keys.yaml)
PATH = "/v1/chat/completions"

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
    listen 127.0.0.1:{port}{ssl} backlog=4096;{tls}
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


NGINX_TLS = """
    ssl_certificate {cert};
    ssl_certificate_key {key};
    ssl_protocols TLSv1.2 TLSv1.3;"""


@dataclass(frozen=True)
class TlsFiles:
    """The certificate both proxies present (PEM, key 0600) and the CA their clients verify it with."""

    cert: Path
    key: Path
    ca: Path


@dataclass
class Target:
    """One thing the client streams through: direct (the upstream itself), nginx or the gateway."""

    name: str
    port: int
    key: str | None
    pids: list[int]  # the proxy's processes (for "direct": the upstream itself)
    upstream: list[int]  # the upstream's process: shares CPU 0 with this client
    bench: list[int] = field(default_factory=list)  # every process this run started (all targets)
    tls: ssl.SSLContext | None = None  # HTTPS: what the client verifies the proxy with (None: plain)

    def cpu_counters(self) -> dict[str, float]:
        """CPU seconds so far of the proxy, the upstream, this load client, and everything else busy."""
        return {
            "proxy_cpu": cpu_seconds(self.pids),
            "upstream_cpu": cpu_seconds(self.upstream),
            "client_cpu": own_cpu_seconds(),
            # anything else busy on the machine (kernel threads too)
            "other_cpu": busy_cpu_seconds() - cpu_seconds(self.bench) - own_cpu_seconds(),
        }


def find_nginx() -> str | None:
    """The nginx binary: on PATH, or Debian's /usr/sbin/nginx (not on a non-root PATH)."""
    return shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)


def _start_nginx(
    nginx: str, tmp: Path, up_port: int, cpu: int | None, tls: TlsFiles | None
) -> tuple[subprocess.Popen, int]:
    port = free_port()
    user = "user root;" if os.geteuid() == 0 else ""
    on = NGINX_TLS.format(cert=tls.cert, key=tls.key) if tls else ""
    conf = NGINX_CONF.format(
        user=user, tmp=tmp, upstream=up_port, port=port, ssl=" ssl" if tls else "", tls=on
    )
    (tmp / "nginx.conf").write_text(conf)
    proc = subprocess.Popen(
        [nginx, "-p", str(tmp), "-c", str(tmp / "nginx.conf")], preexec_fn=pin(cpu), stderr=subprocess.DEVNULL
    )
    wait_port(port)
    time.sleep(0.3)  # the worker forks after the master listens: let it exist before process_tree()
    return proc, port


def _start_gateway(
    tmp: Path, up_port: int, cpu: int | None, tls: TlsFiles | None
) -> tuple[subprocess.Popen, int]:
    port = free_port()
    keys = tmp / "keys.yaml"
    keys.write_text(f"keys:\n  - name: bench\n    sha256: {hash_key(KEY)}\n")
    os.chmod(keys, 0o600)
    policy = tmp / "policy.yaml"
    doc = {
        "version": 1,
        "listen": {
            "host": "127.0.0.1",
            "port": port,
            **({"tls": {"cert_file": str(tls.cert), "key_file": str(tls.key)}} if tls else {}),
        },
        "keys_file": "keys.yaml",
        "models": {"bench": {"colocated": [f"http://127.0.0.1:{up_port}"]}},
        "long_prompt_tokens": 8192,
        "stage": "colocated-only",
        "stages": {"colocated-only": {"short": 0, "long": 0}},
        "log_requests": False,
    }
    write_policy(policy, policy_text(doc, policy))
    argv = [sys.executable, "-m", "pdfleet.gateway.cli", "--config", str(policy)]
    proc = subprocess.Popen([*argv, "--log-level", "WARNING"], preexec_fn=pin(cpu))
    scheme = "https" if tls else "http"
    wait_http(f"{scheme}://127.0.0.1:{port}/health", tls=client_context(str(tls.ca)) if tls else None)
    return proc, port


def _client_tls(tls: TlsFiles | None) -> ssl.SSLContext | None:
    return client_context(str(tls.ca)) if tls else None


def start_targets(
    tmp: Path, cpus: tuple[int | None, int | None], procs: list[subprocess.Popen], tls: TlsFiles | None = None
) -> list[Target]:
    """Start the upstream (CPU 0), nginx and the gateway (CPU 1) with their files in `tmp`; the targets.
    With `tls`, both proxies speak HTTPS with that certificate (the direct target stays plain).

    Each process is appended to `procs` as it starts, so that the caller can stop them
    (procs.stop_processes) even when a later one fails. Without nginx its target is left out, with a note.
    """
    up_port = free_port()
    up = subprocess.Popen(
        [sys.executable, "-m", "pdfleet.bench.upstream", "--port", str(up_port)],
        preexec_fn=pin(cpus[0]),
        stdout=subprocess.DEVNULL,
    )
    procs.append(up)
    wait_port(up_port)
    targets = [Target("direct", up_port, None, [up.pid], [up.pid])]
    nginx = find_nginx()
    if nginx:
        ng, ng_port = _start_nginx(nginx, tmp, up_port, cpus[1], tls)
        procs.append(ng)
        targets.append(Target("nginx", ng_port, None, process_tree(ng.pid), [up.pid], tls=_client_tls(tls)))
    else:
        print("note: nginx not found; install it with `apt-get install -y nginx` for the comparison rows")
    gw, gw_port = _start_gateway(tmp, up_port, cpus[1], tls)
    procs.append(gw)
    targets.append(Target("gateway", gw_port, KEY, [gw.pid], [up.pid], tls=_client_tls(tls)))
    every = sorted({pid for t in targets for pid in t.pids})
    for t in targets:
        t.bench = every
    return targets

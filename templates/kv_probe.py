"""The KV-path probe `invoke verify --kv-path` runs on a prefill host and its decode peer (NIXL, DRAM).

A program for the hosts, not a module of pdfleet (it imports the transfer library, which the kv_transfer
role installs on P/D hosts and pdfleet does not depend on): verify reads this file from the templates
directory and sends its source over SSH (`python -c`) to the vLLM venv, so a host runs it without the host
wheel. The standard library, numpy and NIXL only.

It moves one buffer as vLLM's NixlConnector does: the prefill side (`serve`) registers a DRAM buffer with a
UCX agent and answers on a side channel with its agent metadata, the buffer's address and its data
listeners (its own non-loopback listening sockets); the decode side (`fetch`) opens a TCP connection to
each listener (a refused or blocked data port fails at once, naming it, where UCX would retry until the
probe is killed), loads that metadata (`add_remote_agent`: where UCX connects to the prefill host's data
port), READs the buffer with a notification, and checks its SHA-256. Both load the host's kv-transfer.env
first, so the UCX settings are the ones vLLM runs with. Each side prints `stage NAME` as it goes and one
JSON line at the end (pdfleet.checks.kv_path reads them and judges).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import socket
import sys
import time
from typing import Any

NOTIF = b"pdfleet-kv-probe-done"


def stage(name: str) -> None:
    print(f"stage {name}", flush=True)


def load_env(path: str) -> None:
    """KEY=value lines of a systemd env file into this process's environment (before UCX starts)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and not key.strip().startswith("#"):
            os.environ[key.strip()] = value.strip().strip("\"'")


def library() -> Any:
    """NIXL's API: the `nixl` meta package (what vLLM installs), else a CUDA build's module alone (the lab's
    nixl-cu12 without its torch dependency)."""
    try:
        import nixl._api as api
    except ImportError:
        try:
            import nixl_cu12._api as api
        except ImportError as exc:
            raise RuntimeError(
                f"no NIXL module importable (nixl, nixl_cu12) in {sys.executable}: {exc}"
            ) from exc
    return api


def agent_of(nixl: Any, name: str) -> Any:
    return nixl.nixl_agent(name, nixl.nixl_agent_config(backends=["UCX"]))


def register(agent: Any, array: Any) -> Any:
    """The buffer registered as DRAM_SEG; its transfer descriptor list."""
    region = (array.ctypes.data, array.nbytes, 0)
    agent.register_memory([(*region, "")], "DRAM")
    return agent.get_xfer_descs([region], "DRAM")


def listening(skip: int) -> list[list[Any]]:
    """[address, port] of the TCP sockets this process listens on (UCX's data listeners, once the agent is
    up), from /proc: the probe's own side-channel port and loopback-bound ones left out."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for path, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            with open(path, encoding="ascii") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            hex_addr, _, hex_port = fields[1].partition(":")
            if fields[3] != "0A" or fields[9] not in inodes or int(hex_port, 16) == skip:
                continue  # 0A: LISTEN
            raw = bytes.fromhex(hex_addr)
            if width == 8:
                address = socket.inet_ntop(socket.AF_INET, raw[::-1])
            else:  # four host-order 32-bit words
                address = socket.inet_ntop(
                    socket.AF_INET6, b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                )
            if not address.startswith("127.") and address != "::1":
                found.append([address, int(hex_port, 16)])
    return found


def reach_data_ports(peer: str, ports: list[list[Any]], timeout: float) -> str | None:
    """Why a TCP connection to one of the prefill side's data listeners (bound to `peer` or to every
    address) fails, None when each accepts: a refused or blocked port fails here at once, where UCX would
    retry until the probe is killed."""
    for address, port in ports:
        if address not in (peer, "0.0.0.0", "::"):
            continue
        try:
            socket.create_connection((peer, int(port)), timeout=timeout).close()
        except OSError as exc:
            return f"TCP {peer}:{port}: {exc}"
    return None


def buffer_facts(data: Any, port: int) -> dict[str, Any]:
    """What the prefill side offers of its registered buffer, beside the library's own handle: its address,
    size and SHA-256, and this process's data listeners (`listening`, the side channel's `port` left out)."""
    return {
        "addr": int(data.ctypes.data),
        "bytes": int(data.nbytes),
        "sha256": hashlib.sha256(data.tobytes()).hexdigest(),
        "data_ports": listening(port),
    }


def side_channel(port: int, timeout: float) -> socket.socket:
    """The prefill side's side channel: a TCP server on `port`, each accept waiting at most `timeout`."""
    stage("side_channel")
    server = socket.create_server(("", port), reuse_port=False)
    server.settimeout(timeout)
    return server


def give_offer(server: socket.socket, offer: dict[str, Any]) -> None:
    """Answer the decode side's first connection with the offer (one JSON line)."""
    conn, _ = server.accept()
    with conn:
        conn.sendall(json.dumps(offer).encode() + b"\n")


def checked(local: Any, offer: dict[str, Any], setup: float, seconds: float) -> dict[str, Any]:
    """The decode side's result: ok when the bytes it read are the prefill buffer's (SHA-256)."""
    stage("verify")
    same = hashlib.sha256(local.tobytes()).hexdigest() == offer["sha256"]
    result = {"ok": same, "role": "fetch", "bytes": offer["bytes"], "setup_s": setup, "seconds": seconds}
    return result if same else {**result, "error": "the bytes read differ from the prefill buffer's"}


def serve(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np

    nixl = library()
    stage("register")
    agent = agent_of(nixl, f"pdfleet-probe-prefill-{os.getpid()}")
    data = np.frombuffer(os.urandom(args.bytes), dtype=np.uint8).copy()
    register(agent, data)
    metadata = base64.b64encode(agent.get_agent_metadata()).decode()
    with side_channel(args.port, args.timeout) as server:
        give_offer(server, {"metadata": metadata, **buffer_facts(data, args.port)})
    stage("wait_notification")
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        if any(NOTIF in m for msgs in agent.get_new_notifs().values() for m in msgs):
            return {"ok": True, "role": "serve", "bytes": args.bytes}
        time.sleep(0.005)
    return {"ok": False, "role": "serve", "error": f"no notification within {args.timeout} s"}


def mooncake_engine(host: str) -> Any:
    """Mooncake's transfer engine as vLLM's MooncakeConnector starts it (P2PHANDSHAKE: no etcd; tcp)."""
    try:
        from mooncake.engine import TransferEngine
    except ImportError as exc:
        raise RuntimeError(f"No module named mooncake.engine importable in {sys.executable}: {exc}") from exc
    engine = TransferEngine()
    rc = engine.initialize(host, "P2PHANDSHAKE", "tcp", "")
    if rc != 0:
        raise RuntimeError(f"TransferEngine.initialize returned {rc}")
    return engine


def serve_mooncake(args: argparse.Namespace) -> dict[str, Any]:
    """The prefill side over Mooncake: register the buffer, offer the engine's session, then stay up until
    the decode side says it read (a second connection to the side channel)."""
    import numpy as np

    stage("register")
    engine = mooncake_engine(args.host)
    data = np.frombuffer(os.urandom(args.bytes), dtype=np.uint8).copy()
    rc = engine.register_memory(int(data.ctypes.data), int(data.nbytes))
    if rc != 0:
        raise RuntimeError(f"register_memory returned {rc}")
    session = f"{args.host}:{engine.get_rpc_port()}"
    with side_channel(args.port, args.timeout) as server:
        give_offer(server, {"session": session, **buffer_facts(data, args.port)})
        stage("wait_notification")
        done, _ = server.accept()
        done.close()
    return {"ok": True, "role": "serve", "bytes": args.bytes}


def engine_errors(text: str) -> str:
    """Mooncake's glog error lines (`E1203 17:45:17.957858 17464 file.cpp:1030] ...`), their text."""
    said = [
        line.split("] ", 1)[-1].strip()
        for line in text.splitlines()
        if line[:1] == "E" and line[1:5].isdigit()
    ]
    return "; ".join(dict.fromkeys(said)) or "nothing in its log"


def read_timed(engine: Any, offer: dict[str, Any], local: int) -> tuple[int, float, float]:
    """(return code, setup s, transfer s): 4 KiB first (opens the segment: the handshake), then the buffer."""
    started = time.monotonic()
    rc = engine.transfer_sync_read(offer["session"], local, offer["addr"], 4096)
    setup = time.monotonic() - started
    if rc != 0:
        return rc, setup, 0.0
    stage("transfer")
    started = time.monotonic()
    rc = engine.transfer_sync_read(offer["session"], local, offer["addr"], offer["bytes"])
    return rc, setup, time.monotonic() - started


def fetch_mooncake(args: argparse.Namespace) -> dict[str, Any]:
    """The decode side over Mooncake: read the buffer from the prefill's session (a first small read opens
    the segment: the setup time), check its SHA-256, tell the prefill side. A negative return names the
    engine's own error lines (its log, on this process's stderr)."""
    import tempfile

    import numpy as np

    stage("side_channel")
    offer = receive_offer(args.peer, args.port, args.timeout)
    stage("register")
    engine = mooncake_engine(args.host)
    local = np.zeros(offer["bytes"], dtype=np.uint8)
    if engine.register_memory(int(local.ctypes.data), int(local.nbytes)) != 0:
        raise RuntimeError("register_memory failed")
    stage("connect")
    blocked = reach_data_ports(args.peer, offer.get("data_ports", []), min(3.0, args.timeout))
    if blocked is not None:
        return {"ok": False, "role": "fetch", "error": blocked}
    with tempfile.TemporaryFile() as log:
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)  # the engine's glog: read back for a failure's reason
        try:
            rc, setup, seconds = read_timed(engine, offer, int(local.ctypes.data))
        finally:
            os.dup2(saved, 2)
            log.seek(0)
            text = log.read().decode(errors="replace")
            sys.stderr.write(text)
    if rc != 0:
        reason = engine_errors(text)
        return {
            "ok": False,
            "role": "fetch",
            "error": f"transfer_sync_read from {offer['session']} returned {rc}: {reason}",
        }
    result = checked(local, offer, setup, seconds)
    with socket.create_connection((args.peer, args.port), timeout=5):
        pass  # the prefill side may go
    return result


def receive_offer(peer: str, port: int, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:  # the prefill side may still be starting: retry refused connections until the deadline
        try:
            with socket.create_connection((peer, port), timeout=min(5.0, timeout)) as conn:
                reader = conn.makefile("rb")
                line = reader.readline()
                return dict(json.loads(line))
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def fetch(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np

    nixl = library()
    stage("side_channel")
    offer = receive_offer(args.peer, args.port, args.timeout)
    stage("register")
    agent = agent_of(nixl, f"pdfleet-probe-decode-{os.getpid()}")
    local = np.zeros(offer["bytes"], dtype=np.uint8)
    local_descs = register(agent, local)
    remote_descs = agent.get_xfer_descs([(offer["addr"], offer["bytes"], 0)], "DRAM")
    stage("connect")
    started = time.monotonic()
    blocked = reach_data_ports(args.peer, offer.get("data_ports", []), min(3.0, args.timeout))
    if blocked is not None:
        return {"ok": False, "role": "fetch", "error": blocked}
    remote = agent.add_remote_agent(base64.b64decode(offer["metadata"]))
    handle = agent.initialize_xfer("READ", local_descs, remote_descs, remote, NOTIF)
    setup = time.monotonic() - started
    stage("transfer")
    started = time.monotonic()
    state = agent.transfer(handle)
    deadline = started + args.timeout
    while state == "PROC" and time.monotonic() < deadline:
        state = agent.check_xfer_state(handle)
    seconds = time.monotonic() - started
    if state != "DONE":
        return {"ok": False, "role": "fetch", "error": f"transfer state {state} after {seconds:.1f} s"}
    return checked(local, offer, setup, seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=("serve", "fetch"), help="serve on the prefill host, fetch on decode")
    parser.add_argument("--port", type=int, required=True, help="the probe's side-channel TCP port")
    parser.add_argument("--peer", default="", help="fetch: the prefill host's address")
    parser.add_argument("--bytes", type=int, default=64 << 20, help="serve: the buffer's size")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds each wait may take")
    parser.add_argument("--env-file", default="", help="the host's kv-transfer.env, loaded first")
    parser.add_argument(
        "--library", choices=("nixl", "mooncake"), default="nixl", help="the connector's library"
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="mooncake: this host's address (its engine's session)"
    )
    args = parser.parse_args(argv)
    if args.env_file:
        load_env(args.env_file)
    try:
        if args.library == "mooncake":
            result = serve_mooncake(args) if args.role == "serve" else fetch_mooncake(args)
        else:
            result = serve(args) if args.role == "serve" else fetch(args)
    except Exception as exc:  # the library's own words are the finding
        result = {"ok": False, "role": args.role, "error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(result), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

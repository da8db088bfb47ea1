"""`invoke verify --kv-path`: the probe's commands for a prefill→decode pair and the verdict on its output.

The probe (templates/kv_probe.py; verify sends its source) runs with the connector's library on both
hosts; this module builds the two commands (pure) and reads what they printed into a verdict with the fix
(pure). The SSH runner is the host check pdfleet.checks.hosts.kv_path.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

PROBE_FILE = "kv_probe.py"  # in the templates directory
PROBE_BYTES = 64 << 20  # 64 MiB: long enough to read a throughput, short enough for a 2-core lab
FETCH_TIMEOUT_S = 12  # the decode side is killed after this: a blocked data port fails well within 15 s
SERVE_TIMEOUT_S = 20  # the prefill side waits this long for its peer (then exits on its own)
TIMED_OUT = 124  # coreutils timeout's exit status
FIX_SEP = "; fix: "  # a failed pair's message: "<summary>; fix: <fix>" (split by `split_message`)


@dataclass(frozen=True)
class ProbeSide:
    """What one side printed: the stages it reached, its JSON result (None when killed first), exit code."""

    stages: tuple[str, ...]
    result: dict[str, object] | None
    rc: int

    @property
    def last_stage(self) -> str:
        return self.stages[-1] if self.stages else "start"


@dataclass(frozen=True)
class PathFacts:
    """What the verdict needs besides the probe's output: the pair, its ports and the link's floor."""

    prefill: str
    decode: str
    prefill_address: str
    probe_port: int
    data_ports: str | None  # UCX_TCP_PORT_RANGE of the prefill host's kv-transfer.env, if pinned
    floor_gbps: float | None  # what the link should give (RDMA floor), None when nothing is promised
    transport: str  # "rdma" or "tcp": how KV is meant to move between these hosts
    library: str = "nixl"  # the connector's: "nixl" or "mooncake" (the probe's --library)


@dataclass(frozen=True)
class Verdict:
    ok: bool
    summary: str
    fix: str = ""
    gbps: float | None = None
    setup_ms: float | None = None


def probe_command(python: str, role: str, args: list[str], timeout_s: int, source: str) -> str:
    """`timeout N <venv python> -c <probe source> ROLE ARGS` (the source travels in argv: no upload)."""
    argv = [python, "-c", source, role, *args]
    return f"timeout {timeout_s} " + " ".join(shlex.quote(a) for a in argv)


def serve_command(
    python: str, port: int, env_file: str, log: str, source: str, library: str = "nixl", host: str = ""
) -> str:
    """The prefill side, detached (its output to `log`); echoes its pid for the runner to stop it.
    Mooncake's engine needs the host's own address (its session: `host:rpc_port`)."""
    args = ["--port", str(port), "--bytes", str(PROBE_BYTES), "--timeout", str(SERVE_TIMEOUT_S - 2)]
    args += ["--library", library, *(["--host", host] if host else [])]
    cmd = probe_command(python, "serve", [*args, "--env-file", env_file], SERVE_TIMEOUT_S, source)
    return f"nohup {cmd} > {shlex.quote(log)} 2>&1 & echo $!"


def fetch_command(
    python: str, peer: str, port: int, env_file: str, source: str, library: str = "nixl", host: str = ""
) -> str:
    """The decode side, in the foreground, bounded by FETCH_TIMEOUT_S."""
    args = [
        "--library",
        library,
        *(["--host", host] if host else []),
        "--peer",
        peer,
        "--port",
        str(port),
        "--timeout",
        str(FETCH_TIMEOUT_S - 2),
        "--env-file",
        env_file,
    ]
    return probe_command(python, "fetch", args, FETCH_TIMEOUT_S, source)


def failure_message(found: Verdict) -> str:
    """What a failed pair's check says: the summary, then the fix after FIX_SEP."""
    return f"{found.summary}{FIX_SEP}{found.fix}"


def split_message(message: str) -> tuple[str, str]:
    """(summary, fix) of a check's message (the fix is empty when it names none)."""
    summary, _, fix = message.partition(FIX_SEP)
    return summary, fix


def parse_side(output: str, rc: int) -> ProbeSide:
    """The `stage NAME` lines and the last JSON object line of one side's output."""
    stages: list[str] = []
    result: dict[str, object] | None = None
    for line in output.splitlines():
        if line.startswith("stage "):
            stages.append(line.removeprefix("stage ").strip())
        elif line.startswith("{"):
            try:
                result = dict(json.loads(line))
            except ValueError:
                continue
    return ProbeSide(tuple(stages), result, rc)


def _error(side: ProbeSide) -> str:
    if side.result is not None and side.result.get("error"):
        return str(side.result["error"])
    if side.rc == TIMED_OUT:
        return f"no answer within {FETCH_TIMEOUT_S} s"
    return f"exited {side.rc} without a result"


def _failure(facts: PathFacts, serve: ProbeSide, fetch: ProbeSide) -> Verdict:
    """Why the pair moved nothing, from the stage the decode side stopped at, and what to change."""
    pair = f"{facts.prefill}->{facts.decode}"
    said = _error(fetch)
    if "no NIXL module" in said or "No module named" in said:
        return Verdict(
            False,
            f"{pair}: the transfer library does not load: {said}",
            "run `invoke provision` (the kv_transfer role installs it into the vLLM venv)",
        )
    stage = fetch.last_stage
    if stage in ("start", "side_channel"):
        where = f"{facts.prefill_address}:{facts.probe_port}"
        fix = (
            f"allow TCP {facts.probe_port} from {facts.decode} to {facts.prefill}, and check "
            f"{facts.prefill} is up (the prefill side reached: {serve.last_stage})"
        )
        return Verdict(False, f"{pair}: the probe's side channel {where} is unreachable: {said}", fix)
    if stage == "connect" and facts.library == "mooncake":
        fix = (
            f"allow TCP from {facts.decode} to {facts.prefill} on the ports Mooncake's transfer engine "
            f"listens on (its RPC/handshake port and its TCP transport's, chosen at start: "
            f"`ss -ltnp` on {facts.prefill} shows them)"
        )
        return Verdict(False, f"{pair}: Mooncake could not connect to {facts.prefill}'s engine ({said})", fix)
    if stage == "connect":
        ports = facts.data_ports
        named = f"UCX data port{'s' if ports and '-' in ports else ''} {ports}" if ports else "UCX data port"
        what = f"{pair}: UCX could not connect to {facts.prefill}'s {named} ({said})"
        if ports:
            fix = f"allow TCP {ports} from {facts.decode} to {facts.prefill} (UCX_TCP_PORT_RANGE)"
        else:
            fix = (
                f"allow UCX's TCP data connection from {facts.decode} to {facts.prefill}: UCX picks an "
                "ephemeral port; set kv_transfer.ucx_tcp_port_range to pin a range a firewall can open"
            )
        return Verdict(False, what, fix)
    if stage == "transfer":
        return Verdict(
            False,
            f"{pair}: the transfer started and did not finish: {said}",
            "a path that drops large packets or a partition: check the MTU on both hosts and the "
            "switch, and that UCX_TCP_USER_TIMEOUT is rendered (kv-transfer.env)",
        )
    return Verdict(False, f"{pair}: {said} (at stage {stage})", "see the probe's output above")


def verdict(facts: PathFacts, serve: ProbeSide, fetch: ProbeSide) -> Verdict:
    """Pass with throughput and setup time, or fail with what broke and the fix; far below the floor fails."""
    result = fetch.result or {}
    if not result.get("ok"):
        return _failure(facts, serve, fetch)
    moved, seconds, setup = (float(str(result[k])) for k in ("bytes", "seconds", "setup_s"))
    gbps = moved * 8 / max(seconds, 1e-9) / 1e9
    pair = f"{facts.prefill}->{facts.decode}"
    said = f"{pair}: {moved / (1 << 20):.0f} MiB in {seconds * 1000:.0f} ms = {gbps:.2f} Gb/s"
    said += f", setup {setup * 1000:.0f} ms"
    if facts.floor_gbps is None:
        return Verdict(
            True,
            f"{said} over {facts.transport} (no floor: nothing promised for this link)",
            gbps=gbps,
            setup_ms=setup * 1000,
        )
    if gbps < facts.floor_gbps / 2:
        fix = (
            "UCX is likely on TCP instead of RC: check UCX_TLS and UCX_NET_DEVICES in kv-transfer.env, the "
            "GID index (UCX_IB_GID_INDEX: RoCE v2), and the MTU on both ports"
        )
        return Verdict(
            False, f"{said}: far below rdma.min_bandwidth_gbps {facts.floor_gbps}", fix, gbps, setup * 1000
        )
    return Verdict(True, f"{said} (floor {facts.floor_gbps} Gb/s)", gbps=gbps, setup_ms=setup * 1000)

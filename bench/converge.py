"""No-op converge benchmark (rerunnable; not a test): `python bench/converge.py` (root, lab up).

Times `invoke provision` on a converged lab fleet, for a small fleet (`--small`, four hosts by
default) and the whole fleet of `--inventory` (16 hosts in inventory/lab-16.yml), with this tree's
engine and with the engine of `--baseline` (a git ref: the tree at that commit, exported to a temp
dir, with this tree's inventory and profile copied in when it lacks them). Every run is a fresh
`invoke provision` process, as an operator runs it; rounds are interleaved (each round runs every
engine x fleet once, the order rotating), the table shows medians. Per run it counts, per host:
- SSH sessions, remote commands (exec requests; how many through `sudo -n`) and SFTP sessions, by
  wrapping paramiko in the provision process (the same count for both engines);
- host CPU: the CPU seconds of every process in the host's container over the run (pdfleet.lab.usage),
  minus what the host burns idle over the same time (measured before the rounds).
With `--cycle` it first brings the fleet up and provisions it (`invoke lab.up --inventory`, then
`invoke provision`; the first timed run then checks that it converged to 0 changed) and takes the lab
down at the end: the 16-host lab's whole life, too slow for CI (minutes), as a rerunnable bench.
A run that changes anything is an error: without --cycle the fleet must be converged first, e.g.
`invoke lab.up --inventory inventory/lab-16.yml` then
`invoke provision --profile lab-16 --inventory inventory/lab-16.yml`.
The JSON result goes to `--out`; the Markdown table to stdout.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def child(tree: Path, counts_path: Path, argv: list[str]) -> int:
    """Run `invoke ARGV` in this process with paramiko wrapped to count sessions and commands per peer."""
    import paramiko
    from invoke.main import program

    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    start_client = paramiko.Transport.start_client
    exec_command = paramiko.Channel.exec_command
    from_transport = paramiko.SFTPClient.from_transport.__func__

    def peer(transport: paramiko.Transport) -> str:
        return str(transport.getpeername()[0])

    def counted_start(self: paramiko.Transport, *a: Any, **k: Any) -> Any:
        counts[peer(self)]["sessions"] += 1
        return start_client(self, *a, **k)

    def counted_exec(self: paramiko.Channel, command: Any) -> Any:
        text = command.decode() if isinstance(command, bytes) else str(command)
        c = counts[peer(self.get_transport())]
        c["commands"] += 1
        c["sudo"] += text.startswith("sudo -n")
        return exec_command(self, command)

    def counted_sftp(cls: Any, t: paramiko.Transport, *a: Any, **k: Any) -> Any:
        counts[peer(t)]["sftp"] += 1
        return from_transport(cls, t, *a, **k)

    paramiko.Transport.start_client = counted_start
    paramiko.Channel.exec_command = counted_exec
    paramiko.SFTPClient.from_transport = classmethod(counted_sftp)
    os.chdir(tree)
    code = 0
    try:
        program.run(["invoke", *argv], exit=False)
    except SystemExit as exc:
        code = int(exc.code or 0)
    import pdfleet.ops.runner  # already loaded by the run: which tree's engine ran

    engine = str(Path(pdfleet.ops.runner.__file__).resolve())
    counts_path.write_text(json.dumps({"engine": engine, "hosts": {k: dict(v) for k, v in counts.items()}}))
    return code


def engine_python(work: Path) -> Path:
    """A venv interpreter sharing this venv's packages through a .pth line but not its editable pdfleet
    (whose import hook would win over PYTHONPATH), so PYTHONPATH picks the engine's tree."""
    import site

    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site_dir,) = (venv / "lib").glob("python*/site-packages")
    (site_dir / "pdfleet-bench-shared.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return venv / "bin" / "python"


def export_tree(ref: str, into: Path, files: list[str]) -> Path:
    """The repository at `ref` under `into`, plus `files` from this tree it does not have."""
    tree = into / "baseline"
    tree.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    for rel in files:
        if not (tree / rel).exists():
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, tree / rel)
    return tree


def container_inits() -> dict[str, int]:
    """Lab host name → its container's init PID (from the lab's state file)."""
    from pdfleet.lab.paths import LabPaths
    from pdfleet.lab.state import LabState

    state = LabState.load(LabPaths().state_file)
    return {name: rec.init.pid for name, rec in state.hosts.items() if rec.init}


def host_cpu(inits: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far of each lab host's container."""
    from pdfleet.lab.usage import namespace_cpu_seconds

    by_pid = namespace_cpu_seconds(inits.values())
    return {name: by_pid.get(pid, 0.0) for name, pid in inits.items()}


def one_run(
    python: Path,
    tree: Path,
    argv: list[str],
    hosts: dict[str, str],
    inits: dict[str, int],
    idle: dict[str, float],
    work: Path,
) -> dict[str, Any]:
    """One `invoke provision` run: wall time, per-host counts and host CPU; errors unless 0 changed."""
    counts_path, report_path = work / "counts.json", work / "report.json"
    before = host_cpu(inits)
    t0 = time.monotonic()
    proc = subprocess.run(
        [
            str(python),
            __file__,
            "--child",
            str(tree),
            str(counts_path),
            "--",
            *argv,
            "--json",
            str(report_path),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(tree)},
    )
    wall = time.monotonic() - t0
    after = host_cpu(inits)
    if proc.returncode != 0:
        raise SystemExit(f"provision failed in {tree}:\n{proc.stderr[-3000:]}")
    totals = json.loads(report_path.read_text())["totals"]
    if totals["changed"] or totals["failed"]:
        raise SystemExit(f"not a no-op converge ({totals}); provision the fleet first (see --help)")
    counted = json.loads(counts_path.read_text())
    if not counted["engine"].startswith(str(tree.resolve()) + "/"):
        raise SystemExit(f"the run in {tree} loaded the engine from {counted['engine']}")
    by_address = counted["hosts"]
    per_host = {}
    for name, address in hosts.items():
        c = by_address.get(address, {})
        cpu = after[name] - before[name] - idle.get(name, 0.0) * wall
        per_host[name] = {
            "sessions": c.get("sessions", 0),
            "commands": c.get("commands", 0),
            "sudo": c.get("sudo", 0),
            "sftp": c.get("sftp", 0),
            "cpu_s": cpu,
        }
    return {"wall_s": wall, "hosts": per_host}


def idle_rates(inits: dict[str, int], seconds: float) -> dict[str, float]:
    """CPU seconds per second each host burns with nobody converging it (its services, timers)."""
    before = host_cpu(inits)
    time.sleep(seconds)
    after = host_cpu(inits)
    return {n: max(0.0, (after[n] - before[n]) / seconds) for n in inits}


def summarize(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Medians over rounds of the wall time and of the per-host means."""

    def per_host_mean(run: dict[str, Any], key: str) -> float:
        values = [h[key] for h in run["hosts"].values()]
        return sum(values) / len(values)

    out = {"wall_s": statistics.median(r["wall_s"] for r in runs)}
    for key in ("sessions", "commands", "sudo", "sftp", "cpu_s"):
        out[key] = statistics.median(per_host_mean(r, key) for r in runs)
    return out


def table(results: dict[str, dict[str, float]], small: int, large: int) -> str:
    """The Markdown table, with the ratios the issue asks for."""
    lines = [
        "| engine | hosts | wall s (median) | SSH sessions/host | commands/host | via sudo/host | "
        "SFTP/host | host CPU s/host |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, r in results.items():
        engine, hosts = key.rsplit("@", 1)
        lines.append(
            f"| {engine} | {hosts} | {r['wall_s']:.2f} | {r['sessions']:.1f} | {r['commands']:.1f} | "
            f"{r['sudo']:.1f} | {r['sftp']:.1f} | {r['cpu_s']:.3f} |"
        )
    lines.append("")
    for engine in ("baseline", "new"):
        s, big = results.get(f"{engine}@{small}"), results.get(f"{engine}@{large}")
        if s and big:
            lines.append(
                f"- {engine}: {large} hosts / {small} hosts wall time = {big['wall_s'] / s['wall_s']:.2f}x"
            )
    for n in (small, large):
        b, new = results.get(f"baseline@{n}"), results.get(f"new@{n}")
        if b and new:
            lines.append(
                f"- {n} hosts, new / baseline: wall {new['wall_s'] / b['wall_s']:.2f}x, commands "
                f"{new['commands'] / b['commands']:.2f}x, "
                f"host CPU {new['cpu_s'] / max(b['cpu_s'], 1e-9):.2f}x"
            )
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sep = sys.argv.index("--")
        return child(Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[sep + 1 :])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (medians over them)")
    parser.add_argument(
        "--inventory", default="inventory/lab-16.yml", help="the large fleet (lab up with it)"
    )
    parser.add_argument("--profile", default="lab-16", help="the profile the fleet was provisioned with")
    parser.add_argument(
        "--small",
        default="lab-gw,lab-colo1,lab-p1,lab-d1",
        help="the small fleet: --limit of the same inventory",
    )
    parser.add_argument(
        "--baseline",
        default="d10cdd9",
        help="git ref whose engine to compare with ('' to skip); default: the branch point",
    )
    parser.add_argument("--idle-seconds", type=float, default=5.0, help="idle window for the hosts' idle CPU")
    parser.add_argument("--out", default="out/bench/converge.json", help="where the JSON result goes")
    parser.add_argument(
        "--cycle",
        action="store_true",
        help="lab.up the inventory and provision it first, lab.down at the end",
    )
    args = parser.parse_args()
    if args.cycle:
        invoke = [sys.executable, "-m", "invoke"]
        t0 = time.monotonic()
        subprocess.run([*invoke, "lab.up", "--inventory", args.inventory], cwd=REPO, check=True)
        t1 = time.monotonic()
        subprocess.run(
            [*invoke, "provision", "--profile", args.profile, "--inventory", args.inventory],
            cwd=REPO,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        print(f"lab.up {t1 - t0:.0f} s, first provision {time.monotonic() - t1:.0f} s", file=sys.stderr)
        try:
            return measure(args)
        finally:
            t2 = time.monotonic()
            subprocess.run([*invoke, "lab.down"], cwd=REPO, check=True)
            print(f"lab.down {time.monotonic() - t2:.0f} s", file=sys.stderr)
    return measure(args)


def measure(args: argparse.Namespace) -> int:
    """The interleaved rounds, the JSON result and the table."""

    from pdfleet.model.inventory import load_inventory

    inventory = load_inventory(REPO / args.inventory)
    small = [s.strip() for s in args.small.split(",") if s.strip()]
    all_hosts = {h.name: h.address for h in inventory.hosts.values()}
    unknown = [s for s in small if s not in all_hosts]
    if unknown:
        raise SystemExit(f"--small: {', '.join(unknown)} not in {args.inventory}")
    inits = container_inits()
    missing = [n for n in all_hosts if n not in inits]
    if missing:
        raise SystemExit(
            f"lab hosts not running: {', '.join(missing)}; run `invoke lab.up --inventory {args.inventory}`"
        )
    base = ["provision", "--profile", args.profile, "--inventory", args.inventory]
    fleets = {
        len(small): (base + ["--limit", ",".join(small)], {n: all_hosts[n] for n in small}),
        len(all_hosts): (base, all_hosts),
    }
    with tempfile.TemporaryDirectory(prefix="pdfleet-bench-converge-") as tmp:
        python = engine_python(Path(tmp))
        trees = {"new": REPO}
        if args.baseline:
            trees["baseline"] = export_tree(
                args.baseline, Path(tmp), [args.inventory, f"profiles/{args.profile}.yml"]
            )
        print(f"idle CPU of the hosts over {args.idle_seconds:g} s ...", file=sys.stderr)
        idle = idle_rates(inits, args.idle_seconds)
        configs = [(engine, n) for engine in trees for n in fleets]
        runs: dict[str, list[dict[str, Any]]] = {f"{e}@{n}": [] for e, n in configs}
        for r in range(args.rounds):
            for k in range(len(configs)):
                engine, n = configs[(k + r) % len(configs)]
                argv, hosts = fleets[n]
                result = one_run(python, trees[engine], argv, hosts, inits, idle, Path(tmp))
                runs[f"{engine}@{n}"].append(result)
                print(f"round {r + 1}: {engine} {n} hosts {result['wall_s']:.2f} s", file=sys.stderr)
    results = {key: summarize(rs) for key, rs in runs.items()}
    out = REPO / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"args": vars(args), "idle_cpu_per_s": idle, "results": results, "runs": runs}, indent=2)
        + "\n"
    )
    print(table(results, len(small), len(all_hosts)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

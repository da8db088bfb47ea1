"""`invoke bench` at the task layer: every option has help; bad options are one clear error before anything
is contacted or written (no traceback, no output directory)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.cli.helpers import invoke_many

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py

REPO = Path(__file__).resolve().parents[3]
ADMIN_KEY = "sk-admin-loopback-0123456789"


def _invoke(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "invoke", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_bench_is_listed_and_every_option_has_help() -> None:
    listed, shown = invoke_many([["--list"], ["--help", "bench"]])
    assert any(ln.strip().startswith("bench ") for ln in listed.stdout.splitlines())
    out = shown.stdout
    options = [ln for ln in out.splitlines() if ln.strip().startswith("--")]
    assert len(options) >= 18
    for line in options:
        assert len(line.strip().split("  ", 1)) == 2, f"no help: {line}"  # the flag, then its help


BAD_OPTIONS = [
    (["--rate", "1", "--concurrency", "2"], "error: give --rate R or --concurrency C, not both"),
    (
        ["--workload", "nope"],
        "error: --workload 'nope': not a workload; choose one of random, long-prompt-mix",
    ),
    (
        ["--pools", "colocated,pd"],
        "error: --pools colocated,pd: pd is not a pool; pools are colocated, disagg, routed",
    ),
    (
        ["--stage", "long-prompts"],
        "error: --stage long-prompts: a stage is for the routed run (--pools routed)",
    ),
    (["--rate", "fast"], "error: --rate 'fast': not a number"),
    (["--duration", "10", "--num-prompts", "5"], "error: give --duration S or --num-prompts N, not both"),
    (
        ["--workload", "trace"],
        "error: --workload trace needs --trace FILE (a Mooncake trace JSONL file)",
    ),
    (["--trace", "no/such.jsonl"], "error: --trace /"),  # the path, made absolute
    (["--trace", "t.jsonl", "--workload", "random"], "error: --trace t.jsonl: replays a trace; it goes"),
    (["--trace", "t.jsonl", "--dataset", "t.jsonl"], "error: --trace t.jsonl: give --trace FILE or"),
    (["--workload", "trace", "--dataset", "no/such.jsonl"], "error: --trace /"),
    (["--workload", "sharegpt", "--dataset", "no/such.json"], "error: --dataset /"),
    # N11: these ended in tracebacks, or built 10^8 requests before starting
    (["--rate", "inf"], "error: --rate 'inf': not a finite number"),
    (["--burstiness", "inf"], "error: --burstiness 'inf': not a finite number"),
    (["--duration", "1e308"], "error: --duration 1e+308: must be > 0 and at most 604800 s"),
    (["--num-prompts", "100000000"], "error: --num-prompts 100000000: must be at least 1 and at most"),
    (
        ["--colocated-choice", "round_robin,lru"],
        "error: --colocated-choice round_robin,lru: lru is not a colocated choice; choices are "
        "round_robin, prefix_load",
    ),
    (["--colocated-choice", " , "], "error: --colocated-choice ' , ': name at least one choice"),
    (
        ["--colocated-choice", "prefix_load", "--pools", "disagg"],
        "error: --colocated-choice prefix_load: the colocated pool is not run (--pools disagg)",
    ),
]


@pytest.fixture(scope="module")
def bad_runs(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Path, subprocess.CompletedProcess[str]]]:
    """Each BAD_OPTIONS case's `invoke bench` (its own --out), all in one process: (out, result)."""
    outs = [tmp_path_factory.mktemp("bad") / "out" for _ in BAD_OPTIONS]
    cases = [
        ["bench", "--profile", "lab-cross", "--out", str(out), *args]
        for out, (args, _) in zip(outs, BAD_OPTIONS, strict=True)
    ]
    return list(zip(outs, invoke_many(cases), strict=True))


@pytest.mark.parametrize(("case", "args", "message"), [(n, *c) for n, c in enumerate(BAD_OPTIONS)])
def test_bad_options_are_one_clear_error_and_write_nothing(
    bad_runs: list[tuple[Path, subprocess.CompletedProcess[str]]], case: int, args: list[str], message: str
) -> None:
    out, proc = bad_runs[case]
    assert proc.args[-len(args) :] == args
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()


def test_a_pool_the_profile_lacks_is_refused() -> None:
    proc = _invoke("bench", "--profile", "lab-colocated", "--pools", "disagg")
    assert proc.returncode != 0
    assert (
        "error: --pools: profile lab-colocated has no disagg pool behind its gateway (it has: colocated)"
        in proc.stderr
    )


def test_an_unknown_model_is_refused_naming_the_known_ones(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = _invoke("bench", "--profile", "lab-two-models", "--model", "gpt-4o", "--out", str(out))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert (
        "error: --model gpt-4o: profile lab-two-models serves no such model; models: llama-8b, llama-1b"
        in proc.stderr
    )
    assert not out.exists()


def test_a_pool_the_model_lacks_is_refused() -> None:
    proc = _invoke("bench", "--profile", "lab-two-models", "--model", "llama-1b", "--pools", "disagg")
    assert proc.returncode != 0
    assert (
        "error: --pools: model llama-1b of profile lab-two-models has no disagg pool behind its gateway "
        "(it has: colocated)" in proc.stderr
    )


def _fleet_files(tmp: Path, ports: dict[str, int]) -> tuple[Path, Path]:
    """A same-host P/D profile with its colocated baseline, every host on a loopback address of its own."""
    profiles = tmp / "profiles"
    profiles.mkdir()
    for name in ("_base", "same-host-pcie"):
        (profiles / f"{name}.yml").write_text((REPO / "profiles" / f"{name}.yml").read_text())
    (profiles / "loop.yml").write_text(f"""extends: same-host-pcie
vllm: {{engine: sim, sim: {{time_scale: 1.0}}}}
kv_transfer: {{side_channel_port: {ports["side"]}}}
pools:
  prefill: {{port: {ports["prefill"]}}}
  decode: {{port: {ports["decode"]}}}
  colocated: {{port: {ports["colocated"]}, max_num_batched_tokens: 2048}}
gateway:
  port: {ports["gateway"]}
  router_port: {ports["router"]}
  router_prometheus_port: {ports["router_prom"]}
  client_key_file: {tmp}/client.key
  admin_key_file: {tmp}/admin.key
  tls: off  # the loopback gateway below listens in plain HTTP (bench verifies an https one's CA)
""")
    inventory = tmp / "inv.yml"
    inventory.write_text("""all:
  children:
    gateway: {hosts: {gw: {ansible_host: 127.0.0.1}}}
    colocated: {hosts: {c1: {ansible_host: 127.0.0.2, gpus: [0]}}}
    prefill: {hosts: {pd1: {ansible_host: 127.0.0.3, gpus: [0, 1]}}}
    decode: {hosts: {pd1: }}
""")
    return profiles / "loop.yml", inventory


@pytest.fixture(scope="module")
def loopback(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """Simulators, the real vllm-router and pdfleet-gateway on loopback addresses laid out by a same-host
    P/D profile (with its colocated baseline) and an inventory: (profile file, inventory file)."""
    from pdfleet.bench.launch import RouterProcess, _Proc
    from pdfleet.bench.local_fleet import KEY
    from pdfleet.bench.procs import free_port
    from pdfleet.gateway.keys import hash_key

    tmp_path = tmp_path_factory.mktemp("loopback")
    ports = {
        k: free_port() for k in ("side", "prefill", "decode", "colocated", "gateway", "router", "router_prom")
    }
    profile, inventory = _fleet_files(tmp_path, ports)
    for name, secret in (("client", KEY), ("admin", ADMIN_KEY)):
        (tmp_path / f"{name}.key").write_text(secret + "\n")
        os.chmod(tmp_path / f"{name}.key", 0o600)
    names = ["--served-model-name", "llama-3.1-8b", "--disable-log-stats"]

    def sim(host: str, port: int, *extra: str, env: dict[str, str] | None = None) -> _Proc:
        argv = [
            sys.executable,
            "-m",
            "pdfleet.sim.cli",
            "serve",
            "meta-llama/Llama-3.1-8B-Instruct",
            *names,
            *extra,
            "--host",
            host,
            "--port",
            str(port),
        ]
        return _Proc(argv, env, f"http://{host}:{port}/health", 60)

    kv = '{"kv_connector":"NixlConnector","kv_role":"%s"}'
    side = {"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.3", "VLLM_NIXL_SIDE_CHANNEL_PORT": str(ports["side"])}
    keys = tmp_path / "keys.yaml"
    keys.write_text(
        f"keys:\n  - name: bench\n    sha256: {hash_key(KEY)}\n"
        f"  - name: admin\n    sha256: {hash_key(ADMIN_KEY)}\n    admin: true\n"
    )
    os.chmod(keys, 0o600)
    policy = tmp_path / "policy.yaml"
    routes = (
        f'colocated: ["http://127.0.0.2:{ports["colocated"]}"], disagg: "http://127.0.0.1:{ports["router"]}"'
    )
    policy.write_text(f"""version: 1
listen: {{host: 127.0.0.1, port: {ports["gateway"]}}}
keys_file: {keys}
models:
  llama-3.1-8b: {{{routes}}}
stage: colocated
stages: {{colocated: {{short: 0, long: 0}}, long-prompts: {{short: 0, long: 100}}}}
log_requests: false
""")
    gateway = _Proc(
        [sys.executable, "-m", "pdfleet.gateway.cli", "--config", str(policy)],
        None,
        f"http://127.0.0.1:{ports['gateway']}/health",
        30,
    )
    prefill, decode = f"http://127.0.0.3:{ports['prefill']}", f"http://127.0.0.3:{ports['decode']}"
    with (
        sim("127.0.0.2", ports["colocated"], "--max-num-batched-tokens", "8192"),
        sim("127.0.0.3", ports["prefill"], "--kv-transfer-config", kv % "kv_producer", env=side),
        sim("127.0.0.3", ports["decode"], "--kv-transfer-config", kv % "kv_consumer"),
        RouterProcess([prefill], [decode], port=ports["router"]),
        gateway,
    ):
        yield profile, inventory


def _bench_argv(loop: tuple[Path, Path], out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "invoke",
        "bench",
        "--profile",
        str(loop[0]),
        "--inventory",
        str(loop[1]),
        "--workload",
        "long-prompt-mix",
        "--out",
        str(out),
        *extra,
    ]


def _live_stage(loop: tuple[Path, Path]) -> tuple[str, int]:
    """The loopback gateway's stage and policy version, from its /admin/policy."""
    port = re.search(r"gateway:\n  port: (\d+)", loop[0].read_text())
    assert port is not None
    request = urllib.request.Request(f"http://127.0.0.1:{port.group(1)}/admin/policy")
    request.add_header("Authorization", f"Bearer {ADMIN_KEY}")
    with urllib.request.urlopen(request, timeout=10) as resp:
        doc = json.loads(resp.read())
    return doc["stage"], doc["version"]


def test_invoke_bench_end_to_end_on_loopback(loopback: tuple[Path, Path], tmp_path: Path) -> None:
    """The task itself through the gateway to both pools, the colocated one per balancing choice, and the
    routed run at the stage asked (--pools routed --stage long-prompts: no pool header, the gateway sends
    the long prompts to P/D and keeps the short ones colocated; per class and per route in results and
    report; the gateway runs its previous stage again after the run): progress, results, report, verdict,
    exit 0."""
    out = tmp_path / "out"
    stage, version = _live_stage(loopback)
    argv = _bench_argv(
        loopback,
        out,
        *("--long-share", "0.2", "--rate", "4", "--num-prompts", "20"),
        *("--colocated-choice", "round_robin,prefix_load"),
        *("--pools", "colocated,disagg,routed", "--stage", "long-prompts"),
    )
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "server side: direct scrape of 3 vLLM endpoint(s)" in proc.stderr
    assert "TTFT P95 ms" in proc.stdout and "verdict: " in proc.stdout
    doc = json.loads((out / "results.json").read_text())
    assert {p: (s["completed"], s["failed"], s["pdfleet"]["gpus"]) for p, s in doc["pools"].items()} == {
        "colocated": (20, 0, 1),
        "disagg": (20, 0, 2),
        "routed": (20, 0, 3),
    }
    _routed_as_staged(doc, out, proc.stdout, stage)
    assert _live_stage(loopback) == (stage, version + 2)  # set for the routed run, put back after it
    assert isinstance(doc["pools"]["disagg"]["pdfleet"]["server"]["kv_transfer_p95_ms"]["decode"], float)
    for pool, role in (("colocated", "colocated"), ("disagg", "prefill")):  # the simulators' own counters
        hit = doc["pools"][pool]["pdfleet"]["server"]["prefix_cache_hit_pct"][role]
        assert isinstance(hit, float) and 0 <= hit <= 100, (pool, hit)
    assert (out / "report.html").exists() and (out / "vllm-disagg.json").exists()
    choices = doc["colocated_choices"]
    assert list(choices) == ["round_robin", "prefix_load"]
    assert all(f["requests"] == 20 and f["failed"] == 0 for f in choices.values())
    assert all(
        f["attribution"] == "instance from the gateway's header (1 instance)" for f in choices.values()
    )
    assert "colocated balancing" in proc.stdout and "prefix_load against round_robin" in proc.stdout


def _routed_as_staged(doc: dict[str, Any], out: Path, stdout: str, stage: str) -> None:
    """The routed run went by the stage asked: short prompts colocated, long ones to P/D, per route."""
    routed = doc["pools"]["routed"]
    assert doc["routing"]["stage"] == "long-prompts" and doc["routing"]["set_from"] == stage
    assert doc["routing"]["stage_percent_disagg"] == {"short": 0, "long": 100}
    assert doc["routing"]["long_prompt_tokens"] == 8192
    by_class = routed["pdfleet"]["requests_by_class"]
    routes = routed["pdfleet"]["routes"]
    assert {k: {c: x["requests"] for c, x in r["classes"].items()} for k, r in routes.items()} == {
        "colocated/short": {"short": by_class["short"]},
        "disagg/stage_weight": {"long": by_class["long"]},
    }
    assert by_class["long"] > 0 and routed["pdfleet"]["decider_reasons"] == {
        "short": by_class["short"],
        "stage_weight": by_class["long"],
    }
    lines = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    assert {(x["length_class"], x["served"], x["decision"]) for x in lines if x["pool"] == "routed"} == {
        ("short", "colocated", "short"),
        ("long", "disagg", "stage_weight"),
    }
    assert (
        "routed: the routes the gateway took" in stdout
        and "## Routes taken" in (out / "report.md").read_text()
    )


def test_ctrl_c_stops_cleanly_and_writes_a_partial_report(
    loopback: tuple[Path, Path], tmp_path: Path
) -> None:
    out, err = tmp_path / "out", tmp_path / "stderr"
    with err.open("w") as sink:
        proc = subprocess.Popen(
            _bench_argv(loopback, out, "--rate", "2", "--duration", "60"),
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=sink,
            text=True,
        )
        deadline = time.monotonic() + 120
        while "server side:" not in err.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(4)  # into the colocated pool's run
        proc.send_signal(signal.SIGINT)
        stdout, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, stdout[-2000:] + err.read_text()[-2000:]
    assert "interrupted; the report is partial" in err.read_text() and "Traceback" not in err.read_text()
    doc = json.loads((out / "results.json").read_text())
    assert doc["partial"] and list(doc["pools"]) == ["colocated"]
    colo = doc["pools"]["colocated"]
    assert colo["pdfleet"]["interrupted"] and colo["failed"] == 0
    assert "(PARTIAL: interrupted)" in (out / "report.md").read_text().splitlines()[0]

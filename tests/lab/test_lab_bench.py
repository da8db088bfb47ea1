"""`invoke bench --profile lab-cross` with the default long-prompt mix on the lab: the files it writes, two
colocated GPUs against one prefill + one decode GPU, and the long-prompt interference on the colocated
pool (short streams' stalls per 100 streams and ITL P99.9 higher than on P/D, with at least 10 short
streams that overlapped a long prefill on their own instance behind them), said so in the report; the
gateway's own counts agree with the bench's within 20% (issue 33), like with like: the short streams that
decoded beside a long prefill on their own instance, and the stalls caused by long prefills (gaps over
the gateway's stall threshold that met a long prefill on the stream's instance). The colocated balancing
choices (`--colocated-choice`) are not run here: the bench's option is tested end to end on loopback
(tests/unit/cli/test_bench.py), prefix_load through the provisioned gateway in test_lab_decider.py, and a
second 30 s colocated run would cost the suite ~35 s."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pdfleet.bench.client import Record
from pdfleet.bench.overlap import stalls_during
from pdfleet.gateway.policy import parse_policy
from pdfleet.metrics.direct import parse_exposition
from pdfleet.model.profile_loader import load_profile
from tests.lab.helpers import REPO_ROOT, LabHandle, gateway_open, gateway_url, lab_deployment, prometheus_url

PROFILE = "lab-cross"
FILES = (
    "results.json",
    "vllm-colocated.json",
    "vllm-disagg.json",
    "requests.jsonl",
    "report.md",
    "report.html",
    "ttft_cdf.png",
    "itl_cdf.png",
    "itl_timeline.png",
    "class_bars.png",
    "server_chain.png",
)


def _invoke(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "invoke", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def bench_out(lab: LabHandle, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """lab-cross provisioned (two colocated hosts, a P/D pair), then one bench of the long-prompt mix."""
    report = tmp_path_factory.mktemp("provision") / "report.json"
    proc = _invoke("provision", "--profile", PROFILE, "--json", str(report))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = tmp_path_factory.mktemp("bench")
    (out / "gateway_policy.yaml").write_text(_gateway_policy(lab))
    before = _gateway_counts()
    # the default long-prompt mix (the demo's settings: a quarter 16K-30K-token documents at 3 req/s),
    # 30 s a pool instead of 60 to keep the suite short (~90 requests a run, ~22 long; at 45 s a run held
    # 26 and 32 same-instance overlaps per choice, so 30 s expects ~17 and ~21 against the report's LOW
    # CONFIDENCE bound of 10)
    proc = _invoke("bench", "--profile", PROFILE, "--duration", "30", "--out", str(out), timeout=1200)
    (out / "stdout.txt").write_text(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "verdict:" in proc.stdout and "TTFT P95" in proc.stdout
    # lab-cross's monitoring.port is not Prometheus's 9090: the server side comes from the one on that port
    assert f"server side: Prometheus at {prometheus_url(PROFILE)}\n" in proc.stderr, proc.stderr[-3000:]
    after = _gateway_counts()
    (out / "gateway_long_prefill.json").write_text(json.dumps({k: after[k] - before[k] for k in after}))
    return out


def _gateway_policy(lab: LabHandle) -> str:
    """The policy the gateway runs (its stall threshold is the one its counters use)."""
    name = lab_deployment(PROFILE).topology.gateways[0].host
    host = next(h for h in lab.hosts if h.name == name)
    code, out, err = lab.ssh(host, "sudo cat /etc/pdfleet/gateway/policy.yaml")
    assert code == 0, err
    return out


def _gateway_counts() -> dict[str, float]:
    """The gateway's short colocated streams that decoded beside a long prefill on their own instance
    (`overlaps`), and their stalls during one (`stalls`: the stalls caused by long prefills)."""
    samples = parse_exposition(gateway_open(gateway_url(PROFILE) + "/metrics", PROFILE).decode(), {})
    names = {"overlaps": "pdfleet_gateway_long_prefill_overlaps_total"}
    names["stalls"] = "pdfleet_gateway_long_prefill_stalls_total"
    return {
        key: sum(
            v
            for (name, labels), v in samples.items()
            if name == metric and dict(labels).get("length_class") == "short"
        )
        for key, metric in names.items()
    }


def _records(lines: list[dict[str, Any]]) -> list[Record]:
    """requests.jsonl's lines of one run back as the client's records (chunk times rebuilt from the
    send time, TTFT and the gaps; the profile's seconds)."""
    out = []
    for x in lines:
        r = Record(x["index"], x["pool"], x["length_class"], x["input_len"], x["max_tokens"])
        r.start, r.cancelled, r.error = x["start_time"], x["cancelled"], x["error"] or ""
        if x["success"]:
            t = x["start_time"] + x["ttft"]
            r.chunks = [t]
            for gap in x["itl"]:
                t += gap
                r.chunks.append(t)
        out.append(r)
    return out


def test_bench_writes_every_file(bench_out: Path) -> None:
    for name in FILES:
        assert (bench_out / name).stat().st_size > 0, name
    doc = json.loads((bench_out / "results.json").read_text())
    assert doc["profile"] == PROFILE and not doc["partial"]
    assert {p: s["pdfleet"]["gpus"] for p, s in doc["pools"].items()} == {"colocated": 2, "disagg": 2}
    for pool in ("colocated", "disagg"):
        s = doc["pools"][pool]
        assert s["completed"] > 0 and s["failed"] == 0, s["pdfleet"]["errors"]
        assert set(s["pdfleet"]["classes"]) == {"short", "long"}
        assert isinstance(
            s["pdfleet"]["server"]["decode_p95_ms"].get("decode" if pool == "disagg" else "colocated"), float
        )
    assert isinstance(doc["pools"]["disagg"]["pdfleet"]["server"]["kv_transfer_p95_ms"]["decode"], float)
    assert doc["verdict"]["decision"] == _rule(doc), doc["verdict"]


def _rule(doc: dict[str, Any]) -> str:
    """The verdict the design's rule gives on this run's own figures: split only if colocated misses the
    TTFT and the TPOT bound with both queues over their thresholds, and the P/D pool meets both bounds.
    Both pools ran with Prometheus scraping them, so every figure the rule reads must be there."""
    slo = load_profile(PROFILE, REPO_ROOT / "profiles").slo
    colo, pd = doc["pools"]["colocated"], doc["pools"]["disagg"]
    deciding = doc["verdict"]["deciding"]
    assert deciding["colocated_ttft_p95_ms"] == colo["p95_ttft_ms"], deciding
    assert deciding["colocated_tpot_p95_ms"] == colo["p95_tpot_ms"], deciding
    ttft_ok, tpot_ok = colo["p95_ttft_ms"] <= slo.ttft_bound_ms, colo["p95_tpot_ms"] <= slo.tpot_bound_ms
    if ttft_ok or tpot_ok:
        return "do not split"
    queue = colo["pdfleet"]["server"]["queue_p95_ms"]["colocated"]
    assert isinstance(queue, float), colo["pdfleet"]["server"]
    if queue <= slo.prefill_queue_p95_ms or queue <= slo.decode_queue_p95_ms:
        return "do not split"
    pd_ok = pd["p95_ttft_ms"] <= slo.ttft_bound_ms and pd["p95_tpot_ms"] <= slo.tpot_bound_ms
    return "split" if pd_ok else "do not split"


def test_long_prompts_interfere_on_the_colocated_pool_and_the_report_says_so(bench_out: Path) -> None:
    doc = json.loads((bench_out / "results.json").read_text())
    colo = doc["pools"]["colocated"]["pdfleet"]["classes"]
    pd = doc["pools"]["disagg"]["pdfleet"]["classes"]
    # the typewriter stops on the colocated pool: a long prompt's chunks hold its decode steps 250-450 ms
    assert colo["short"]["p99_itl_ms"] > pd["short"]["p99_itl_ms"]
    assert colo["short"]["stalls_per_100_streams"] > pd["short"]["stalls_per_100_streams"]  # slo.stall_ms 250
    # above, as the Done-when asks: how far above depends on how many of ~10^4 gaps are stalls (seen
    # 365 ms against 56 ms, and 21.5 ms against 11.1 ms in a run with few stalls)
    assert colo["short"]["p99.9_itl_ms"] > pd["short"]["p99.9_itl_ms"]
    # ... measured on enough short streams that decoded through a long prefill on their own instance
    overlaps = doc["pools"]["colocated"]["pdfleet"]["short_streams"]
    assert overlaps["overlapped_same_instance"] >= 10, overlaps
    assert overlaps["overlapped_stalls"] > 0, overlaps
    assert doc["pools"]["disagg"]["pdfleet"]["short_streams"]["overlapped_same_instance"] == 0
    report = (bench_out / "report.md").read_text()
    n = overlaps["overlapped_same_instance"]
    assert (
        f"Long-prompt interference shows on the colocated pool ({n} short streams overlapped a long "
        "prefill on their own colocated instance)" in report
    )
    assert "LOW CONFIDENCE" not in report
    assert "## Verdict" in report and "per GPU" in report


def test_the_gateways_long_prefill_overlaps_agree_with_the_bench(bench_out: Path) -> None:
    """The gateway knows which instance holds which long prefill until its first byte; the bench reads
    the instance from the gateway's X-Pdfleet-Instance header and times the prefill from the client.
    Their counts of short streams beside a long prefill agree within 20% (the gateway's also counts the
    colocated pool's warm-up requests)."""
    doc = json.loads((bench_out / "results.json").read_text())
    bench = doc["pools"]["colocated"]["pdfleet"]["short_streams"]["overlapped_same_instance"]
    gateway = json.loads((bench_out / "gateway_long_prefill.json").read_text())["overlaps"]
    assert bench >= 10 and abs(gateway - bench) <= 0.2 * bench, (gateway, bench)


def test_the_stalls_caused_by_long_prefills_agree_with_the_bench(bench_out: Path) -> None:
    """Issue 33's metric, like with like: the gateway counts a stall (a gap over its policy's
    stall_threshold_ms) when a long prefill ran on the stream's instance during the gap; the bench counts
    the same from the client's records (stalls_during, at the same threshold) (the gateway's also counts
    the warm-up requests). Not the overlap count: that counts streams. Seen:
    130 and 130 at 250 ms (2026-12-02)."""
    policy = parse_policy(bench_out / "gateway_policy.yaml", (bench_out / "gateway_policy.yaml").read_text())
    stall_s = policy.stall_threshold_ms / 1000
    lines = [json.loads(x) for x in (bench_out / "requests.jsonl").read_text().splitlines()]
    run = [x for x in lines if x["pool"] == "colocated"]
    where = {x["index"]: x["instance"] for x in run if x["instance"] is not None}
    bench = stalls_during(_records(run), where, stall_s)
    gateway = json.loads((bench_out / "gateway_long_prefill.json").read_text())["stalls"]
    figures = {"gateway": gateway, "bench": bench, "stall_threshold_ms": policy.stall_threshold_ms}
    assert bench >= 10 and abs(gateway - bench) <= 0.2 * bench, figures

"""`invoke demo`, the README's first command after setup: lab up, provision lab-cross, every unit healthy,
then a short bench whose headline table and verdict it prints. The bench runs 3 s per pool instead of the
default 25 (~9 requests a pool at the mix's 3 req/s, short streams among them): this test checks what the demo
prints, not the figures (test_lab_bench.py checks those)."""

from __future__ import annotations

import subprocess
import sys

from tests.lab.helpers import REPO_ROOT, LabHandle

UNITS = {
    "lab-gw": ("vllm-router-pd.service", "pdfleet-gateway.service"),
    "lab-colo1": ("vllm-colocated.service",),
    "lab-colo2": ("vllm-colocated.service",),
    "lab-p1": ("vllm-prefill.service",),
    "lab-d1": ("vllm-decode.service",),
}


def test_demo_ends_with_every_unit_active_and_healthy(lab: LabHandle) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", "demo", "--bench-seconds", "3"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "every unit active and healthy" in proc.stderr
    assert "TTFT P95 ms" in proc.stdout and "stalls/100 streams" in proc.stdout and "verdict: " in proc.stdout
    # the closing bench leads with the short streams beside long prefills, with the overlap count
    assert "overlapped a long prefill on their instance" in proc.stdout
    assert "colocated: instance from the gateway's header (2 instances)" in proc.stdout
    assert "invoke lab.env" in proc.stderr and "invoke lab.down" in proc.stderr
    rows = [line.split("│") for line in proc.stdout.splitlines() if line.startswith("│")]
    seen = {(cells[1].strip(), cells[2].strip()): (cells[3].strip(), cells[5].strip()) for cells in rows}
    for host, units in UNITS.items():
        for unit in units:
            assert seen.get((host, unit)) == ("active", "ok"), (host, unit, seen)

"""The `KV Transfer metrics` line against vLLM's own: the keys of each tabled release and connector, the
values as its stats' `reduce()` computes them (run from the cached wheel's source where it is present)."""

from __future__ import annotations
import __future__

import ast
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from pdfleet.model.vllm_release_data import RELEASES
from pdfleet.sim.transfer_log import MIB, Transfer, line, p90

WHEELS = Path("~/.cache/pdfleet/vllm-wheels").expanduser()  # where `python -m tools.vllm_facts` keeps them
WINDOW = [
    Transfer(0.010, 0.001, 2 * MIB, 4),
    Transfer(0.030, 0.003, 6 * MIB, 8),
    Transfer(0.017, 0.002, 3, 5),
]
LOGS = [(version, log) for version in sorted(RELEASES) for log in RELEASES[version].transfer_logs]


def test_p90_is_numpy_s_linear_percentile() -> None:
    for values in ([0.5], [0.01, 0.03], [3.0, 1.0, 2.0, 10.0, 7.5], [0.1 * i for i in range(23)]):
        assert p90(values) == pytest.approx(float(np.percentile(values, 90)))


def test_each_release_logs_its_own_keys() -> None:
    """0.11.0's NIXL counts transfers only; 0.11.1+ adds times and sizes in MiB; 0.33 its failure counts,
    and Mooncake its own set; an interval with nothing logs nothing, one with failures only logs zeros."""
    nixl_011 = RELEASES["0.11.0"].transfer_log("NixlConnector")
    assert nixl_011 is not None and line(nixl_011.keys, WINDOW[:2], {}) == (
        "KV Transfer metrics: num_successful_transfers=2"
    )
    nixl_033 = RELEASES["0.33.0"].transfer_log("NixlConnector")
    assert nixl_033 is not None
    assert line(nixl_033.keys, WINDOW[:2], {"Num failed transfers": 1}) == (
        "KV Transfer metrics: Num successful transfers=2, Avg xfer time (ms)=20.0, P90 xfer time (ms)=28.0, "
        "Avg post time (ms)=2.0, P90 post time (ms)=2.8, Avg MB per transfer=4.0, Throughput (MB/s)=200.0, "
        "Avg number of descriptors=6.0, Num failed transfers=1, Num KV expired reqs=0, "
        "Num notifs after expiry=0"
    )
    assert (
        line(nixl_033.keys, [], {}) is None and line(nixl_011.keys, [], {"Num failed transfers": 3}) is None
    )
    only_failed = line(nixl_033.keys, [], {"Num KV expired reqs": 2})
    assert only_failed is not None and only_failed.startswith(
        "KV Transfer metrics: Num successful transfers=0, "
    )
    assert only_failed.endswith("Num failed transfers=0, Num KV expired reqs=2, Num notifs after expiry=0")
    mooncake = RELEASES["0.33.0"].transfer_log("MooncakeConnector")
    assert (
        mooncake is not None
        and "Avg post time (ms)" not in mooncake.keys
        and "Num failed recvs" in mooncake.keys
    )
    assert RELEASES["0.11.2"].transfer_log("MooncakeConnector") is None


def _reduce_of(version: str, source: str) -> Any:
    """The `reduce` method of the release's KVConnectorStats class in `source`, compiled from the cached
    wheel (nothing of vLLM imported: it needs numpy only)."""
    wheels = sorted(WHEELS.glob(f"vllm-{version}-*.whl"))
    if not wheels:
        pytest.skip(f"vLLM {version}'s wheel is not in {WHEELS} (python -m tools.vllm_facts downloads it)")
    with zipfile.ZipFile(wheels[-1]) as archive:
        tree = ast.parse(archive.read(source).decode())
    stats = next(
        c
        for c in ast.walk(tree)
        if isinstance(c, ast.ClassDef) and any(ast.unparse(b).endswith("KVConnectorStats") for b in c.bases)
    )
    reduce = next(f for f in stats.body if isinstance(f, ast.FunctionDef) and f.name == "reduce")
    scope: dict[str, Any] = {"np": np}
    exec(compile(ast.Module([reduce], []), source, "exec", flags=__future__.annotations.compiler_flag), scope)  # noqa: S102 - vLLM's own reduce, to compare with
    return scope["reduce"]


@pytest.mark.parametrize(("version", "log"), LOGS, ids=[f"{v}-{log.connector}" for v, log in LOGS])
def test_the_line_is_what_the_release_s_reduce_prints(version: str, log: Any) -> None:
    """The wheel's own `reduce()` over the same transfers and failures, joined as KVConnectorLogging.log
    joins it, is the simulator's line."""
    reduce = _reduce_of(version, log.source)
    failures = {"num_failed_transfers": [1.0], "num_failed_handshakes": [], "num_failed_notifications": [2.0]}
    failures |= {
        "num_kv_expired_reqs": [3.0],
        "num_notifications_after_expiry": [],
        "num_failed_recvs": [4.0],
    }
    data = {
        "transfer_duration": [t.xfer_s for t in WINDOW],
        "post_duration": [t.post_s for t in WINDOW],
        "bytes_transferred": [t.nbytes for t in WINDOW],
        "num_descriptors": [t.descriptors for t in WINDOW],
        "num_successful_transfers": len(WINDOW),
        **failures,
    }
    stats = SimpleNamespace(data=data, num_successful_transfers=len(WINDOW), is_empty=lambda: False)
    vllm = "KV Transfer metrics: " + ", ".join(f"{k}={v}" for k, v in reduce(stats).items())
    counted = {"Num failed transfers": 2 if log.connector == "NixlConnector" else 1, "Num KV expired reqs": 1}
    counted |= {"Num notifs after expiry": 0, "Num failed recvs": 1}
    assert line(log.keys, WINDOW, counted) == vllm

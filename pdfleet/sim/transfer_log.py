"""vLLM's periodic `KV Transfer metrics: ...` line, decided from the transfers of one logging interval.

`KVConnectorLogging.log` prints `"KV Transfer metrics: %s"` with `", ".join(f"{k}={v}" ...)` over the
connector stats' `reduce()`, whose keys the facts table holds per release and connector
(`Release.transfer_log`: 0.11.0's NIXL counts transfers only; 0.11.1+ adds times, sizes and descriptors;
0.33 failure counts, Mooncake its own set). The values are computed as `reduce()` computes them: megabytes
are MiB (`/ 2**20`), P90 is numpy's linear percentile, times in ms rounded to 3 decimals, descriptors to 1;
an interval with only failures gives zeros beside its failure counts. vLLM logs nothing for an empty one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MIB = 2**20
FAILURE_KEYS = ("Num failed transfers", "Num failed recvs", "Num KV expired reqs", "Num notifs after expiry")


@dataclass(frozen=True)
class Transfer:
    """One completed transfer as the connector's stats record it."""

    xfer_s: float
    post_s: float  # NIXL's post time (Mooncake keeps none)
    nbytes: int
    descriptors: int


def p90(values: Sequence[float]) -> float:
    """numpy.percentile(values, 90) with its default linear interpolation (values non-empty)."""
    ordered = sorted(values)
    rank = 0.9 * (len(ordered) - 1)
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _figures(window: Sequence[Transfer]) -> dict[str, float]:
    """Every figure a release's line may hold, for an interval with transfers."""
    n = len(window)
    xfer = [t.xfer_s for t in window]
    post = [t.post_s for t in window]
    total_mib = sum(t.nbytes for t in window) / MIB
    total_s = sum(xfer)
    return {
        "num_successful_transfers": n,
        "Num successful transfers": n,
        "Avg xfer time (ms)": round(sum(xfer) / n * 1e3, 3),
        "P90 xfer time (ms)": round(p90(xfer) * 1e3, 3),
        "Avg post time (ms)": round(sum(post) / n * 1e3, 3),
        "P90 post time (ms)": round(p90(post) * 1e3, 3),
        "Avg MB per transfer": round(total_mib / n, 3),
        "Throughput (MB/s)": round(total_mib / total_s, 3) if total_s > 0 else 0.0,
        "Avg number of descriptors": round(sum(t.descriptors for t in window) / n, 1),
    }


def line(keys: Sequence[str], window: Sequence[Transfer], failures: Mapping[str, int]) -> str | None:
    """The line a release whose `reduce()` has `keys` logs for an interval (None: nothing to log, as vLLM
    logs nothing for an empty interval); `failures` counts the interval's failures by their key.
    KeyError names a key the simulator cannot compute (a new release's: to model, not to guess)."""
    failed = {key: failures.get(key, 0) for key in keys if key in FAILURE_KEYS}
    if not window and not any(failed.values()):
        return None
    figures = _figures(window) if window else dict.fromkeys(keys, 0)
    values = {**figures, **failed}
    return "KV Transfer metrics: " + ", ".join(f"{key}={values[key]}" for key in keys)

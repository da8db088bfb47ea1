"""Simulating many layouts: one process per core (each layout is independent, CPU-bound pure Python), the
traffic handed to each worker once, results in the layouts' order."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context

from pdfleet.bench.stats import Bounds
from pdfleet.plan.path import NOT_MODELLED, RequestPath
from pdfleet.plan.predict import Prediction, Request, simulate
from pdfleet.plan.space import Hardware, Layout


@dataclass(frozen=True)
class _Job:
    """What every layout of one plan is simulated with."""

    requests: Sequence[Request]
    hw: Hardware
    bounds: Bounds
    long_tokens: int
    path: RequestPath


_WORKER: list[_Job] = []  # a worker process's job (set once by _init)


def _init(job: _Job) -> None:
    _WORKER[:] = [job]


def _one(layout: Layout) -> Prediction:
    job = _WORKER[0]
    return simulate(layout, job.requests, job.hw, job.bounds, job.long_tokens, job.path)


def default_workers() -> int:
    """The cores this process may use (at most the machine's)."""
    return max(1, len(os.sched_getaffinity(0)))


def predict_all(
    layouts: Sequence[Layout],
    requests: Sequence[Request],
    hw: Hardware,
    bounds: Bounds,
    long_tokens: int,
    workers: int = 1,
    progress: Callable[[int, int], None] | None = None,
    path: RequestPath = NOT_MODELLED,
) -> list[Prediction]:
    """Every layout's prediction (each route's request `path` added), in order; `workers` > 1 spreads
    layouts over that many processes."""
    total = len(layouts)
    if workers <= 1 or total <= 1:
        out = []
        for i, layout in enumerate(layouts):
            out.append(simulate(layout, requests, hw, bounds, long_tokens, path))
            if progress:
                progress(i + 1, total)
        return out
    ctx = get_context("fork")  # workers inherit the imports; the caller runs no threads meanwhile
    with ProcessPoolExecutor(
        workers, mp_context=ctx, initializer=_init, initargs=(_Job(requests, hw, bounds, long_tokens, path),)
    ) as pool:
        results = []
        for i, pred in enumerate(pool.map(_one, layouts)):
            results.append(pred)
            if progress:
                progress(i + 1, total)
        return results

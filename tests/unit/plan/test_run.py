"""Layouts spread over worker processes give the predictions one process gives, in the layouts' order."""

from __future__ import annotations

import pytest

from pdfleet.bench.stats import Bounds
from pdfleet.model import catalog
from pdfleet.plan.predict import Request
from pdfleet.plan.run import predict_all
from pdfleet.plan.space import Hardware, Layout, PoolShape

HW = Hardware(catalog.GPUS["H100-SXM"], catalog.MODELS["Llama-3.1-8B"], catalog.LINKS["roce-400g"])


@pytest.mark.procs  # forks worker processes: see tests/unit/conftest.py
def test_two_workers_predict_what_one_does_in_order() -> None:
    reqs = [Request(i * 0.2, 300 + 4000 * (i % 5 == 0), 32, 300 + 4000 * (i % 5 == 0)) for i in range(50)]
    layouts = [
        Layout(colocated=PoolShape(2, 1, 2048)),
        Layout(None, PoolShape(1, 1, 8192), PoolShape(1, 1, 2048)),
        Layout(colocated=PoolShape(1, 2, 8192)),
    ]
    bounds = Bounds(3000, 60, 250)
    seen: list[tuple[int, int]] = []
    one = predict_all(layouts, reqs, HW, bounds, 4096, workers=1)
    two = predict_all(layouts, reqs, HW, bounds, 4096, workers=2, progress=lambda d, t: seen.append((d, t)))
    assert [p.layout for p in two] == layouts
    assert [p.summary for p in two] == [p.summary for p in one]
    assert seen == [(1, 3), (2, 3), (3, 3)]

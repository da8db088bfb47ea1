"""The lab bridge: lab addresses are never addressed while it is absent."""

from __future__ import annotations

import pytest


def test_lab_addresses_are_refused_while_the_bridge_is_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the lab down, packets to 198.18.0.x would follow the default route off this machine."""
    from pdfleet.lab import network

    monkeypatch.setattr(network, "link_exists", lambda name: False)
    problem = network.lab_route_problem(["198.18.0.10", "10.20.0.5", "gw.example"])
    assert problem is not None and "198.18.0.10" in problem and "invoke lab.up" in problem
    assert "10.20.0.5" not in problem
    assert network.lab_route_problem(["10.20.0.5", "gw.example"]) is None
    monkeypatch.setattr(network, "link_exists", lambda name: True)
    assert network.lab_route_problem(["198.18.0.10"]) is None

"""`invoke rebalance --follow`'s loop: a look that fails on a transient error (Prometheus not answering, an
SSH connection refused: real failures on loopback ports nothing listens on) is reported and looked again
after a doubling pause, a success resets the count, five in a row stop it naming the last; any other error
(bad state) stops it at once. The lock that keeps one follower per profile: tests/unit/fleet/
test_layout_store.py; the follower's moves on the lab: tests/lab/test_lab_rebalance_auto.py."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from pdfleet.bench.procs import free_port
from pdfleet.cli.rebalance_proposed import follow_loop
from pdfleet.errors import ConnectError, ValidationError
from pdfleet.fleet.live_layout import agreed_layout
from pdfleet.metrics.prometheus import PrometheusClient
from pdfleet.ops import ssh


@dataclass(frozen=True)
class _Host:
    """A host whose SSH port nothing listens on."""

    port: int
    name: str = "gone"
    address: str = "127.0.0.1"
    user: str = "pdfleet"
    key_file: str | None = None
    known_hosts_file: str | None = None


def _prometheus_read() -> None:
    PrometheusClient(f"http://127.0.0.1:{free_port()}", timeout=2).instant("up")


def test_transient_failures_are_reported_and_looked_again_after_a_doubling_pause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ssh, "CONNECT_RETRY_PAUSE", 0.0)  # open_connection's own retries, not the follower's
    looks: list[int] = []

    def each() -> None:
        looks.append(len(looks) + 1)
        if looks[-1] == 1:
            _prometheus_read()
        elif looks[-1] == 2:
            ssh.open_connection(_Host(free_port()), str(tmp_path / "known_hosts"), 2)
        elif looks[-1] == 4:
            _prometheus_read()
        elif looks[-1] == 5:
            raise KeyboardInterrupt  # Ctrl-C

    pauses: list[float] = []
    said: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        follow_loop(each, 5.0, pauses.append, said.append)
    assert pauses == [10.0, 20.0, 5.0, 10.0]  # the third look passed: the count starts again
    assert len(said) == 3
    assert said[0].startswith(
        "look failed (1 in a row, --follow stops at 5): Prometheus at http://127.0.0.1:"
    )
    assert "is not answering" in said[0] and said[0].endswith("; next look in 10 s")
    assert said[1].startswith(
        "look failed (2 in a row, --follow stops at 5): cannot connect to gone (127.0.0.1:"
    )
    assert said[2].startswith("look failed (1 in a row,")


def test_five_failed_looks_in_a_row_stop_it_naming_the_last() -> None:
    pauses: list[float] = []
    said: list[str] = []
    with pytest.raises(
        ConnectError, match=r"--follow stopped: 5 looks in a row failed, the last on: Prometheus"
    ):
        follow_loop(_prometheus_read, 5.0, pauses.append, said.append)
    assert pauses == [10.0, 20.0, 40.0, 80.0] and len(said) == 4


def test_bad_state_stops_it_at_once() -> None:
    def each() -> None:  # two gateway hosts keeping different layouts
        agreed_layout({"gw1": '{"profile": "p", "inventory": "i", "hosts": {}}', "gw2": "{}"}, "p.json")

    pauses: list[float] = []
    with pytest.raises(ValidationError):
        follow_loop(each, 5.0, pauses.append, print)
    assert pauses == []

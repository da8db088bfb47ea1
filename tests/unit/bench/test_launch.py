"""SimProcess: a real `pdfleet-sim serve` on loopback, healthy when entered, gone when left."""

from __future__ import annotations

import urllib.request

import pytest

from pdfleet.bench.launch import SimProcess
from pdfleet.bench.workloads import SIM_MODEL

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py


def test_a_sim_process_serves_while_entered_and_stops_after() -> None:
    """/health is 200 inside the block; the process has exited after it; its log is readable."""
    with SimProcess([SIM_MODEL, "--disable-log-stats"]) as sim:
        with urllib.request.urlopen(sim.url + "/health", timeout=5) as resp:
            assert resp.status == 200
        assert sim.url == f"http://127.0.0.1:{sim.port}"
        assert sim.proc is not None
    assert sim.proc.poll() is not None
    assert isinstance(sim.log(), str)


def test_a_sim_that_cannot_start_fails_with_its_log() -> None:
    """A bad option: the start raises at once with the simulator's own error, no process left behind."""
    sim = SimProcess([SIM_MODEL, "--no-such-option"])
    with pytest.raises(RuntimeError, match="(?s)exited with .*no-such-option"), sim:
        pass
    assert sim.proc is not None and sim.proc.poll() is not None


def test_the_loopback_router_selects_by_the_profiles_policy_never_the_routers_default() -> None:
    """vllm-router's own default is cache_aware; the provisioned units render the profile's policy
    (round_robin unless set): the loopback router passes the same flags, rendered the same way."""
    from pdfleet.bench.launch import RouterProcess
    from pdfleet.model.profile_loader import load_profile
    from pdfleet.model.specs import RouterPolicy
    from roles.gateway import policy_args
    from tests.unit.fleet.helpers import REPO

    default = RouterProcess(["http://127.0.0.1:1"], ["http://127.0.0.1:2"])
    profile = load_profile("lab-cross", REPO / "profiles")
    assert default.policy == profile.gateway.router_policy == RouterPolicy()
    assert default.argv[default.argv.index("--policy") + 1] == "round_robin"
    assert policy_args(profile.gateway.router_policy) == ["--policy", "round_robin"]
    split = RouterProcess(["http://p"], ["http://d"], policy=RouterPolicy(prefill="cache_aware"))
    i = split.argv.index("--prefill-policy")
    assert split.argv[i : i + 4] == ["--prefill-policy", "cache_aware", "--decode-policy", "round_robin"]
    assert "--policy" not in split.argv

"""The automatic rebalance's pure decision: a pressed pool with the other having room proposes one host
toward it only after the reaction time in a row; inside the band (hysteresis) nothing is pressed or given;
after a proposal the cool-down holds any other, so a move toward prefill is not followed by one back within
it; the giving pool keeps its minimum; both pools pressed, or no data, propose nothing."""

from __future__ import annotations

from pdfleet.model.rebalancing import RebalanceSpec
from pdfleet.rollout.proposer import Figures, ProposerState, pressed, propose

SPEC = RebalanceSpec.model_validate({"mode": "dry-run", "reaction_s": 30, "cooldown_s": 300})
HOSTS = {"prefill": 2, "decode": 3, "colocated": 0}
# prefill queueing long prompts, decode with room
PREFILL_HOT = Figures(
    prefill_queue_p95_ms=900,
    decode_itl_p95_ms=30,
    decode_kv_usage=0.4,
    decode_preemptions_per_min=0,
    hosts=HOSTS,
)
# decode slow and full, prefill idle-ish
DECODE_HOT = Figures(
    prefill_queue_p95_ms=20,
    decode_itl_p95_ms=180,
    decode_kv_usage=0.95,
    decode_preemptions_per_min=4,
    hosts=HOSTS,
)
CALM = Figures(
    prefill_queue_p95_ms=300, decode_itl_p95_ms=70, decode_kv_usage=0.8, hosts=HOSTS
)  # in the bands


def _run(state: ProposerState, figures: Figures, times: range) -> tuple[ProposerState, list[tuple[int, str]]]:
    """The state after a tick each second of `times`, and each proposal's time and direction."""
    out = []
    for now in times:
        state, proposal, _ = propose(state, figures, SPEC, float(now))
        if proposal is not None:
            out.append((now, f"{proposal.source}->{proposal.target}"))
    return state, out


def test_a_pressed_prefill_pool_gets_one_decode_host_after_the_reaction_time() -> None:
    state, proposals = _run(ProposerState(), PREFILL_HOT, range(0, 100))
    assert proposals == [(30, "decode->prefill")]  # one, at the reaction time; then the cool-down
    _, proposal, why = propose(ProposerState(), PREFILL_HOT, SPEC, 0.0)
    assert proposal is None and why.endswith("pressed 0 of 30 s")
    _, proposal, _ = propose(ProposerState("prefill", 0.0), PREFILL_HOT, SPEC, 30.0)
    assert proposal is not None and proposal.figures["prefill_queue_p95_ms"] == 900
    assert proposal.why.startswith(
        "prefill queue P95 900 ms > 500 and decode has room (prefill queue P95 900 ms,"
    )


def test_a_tick_without_the_pressure_starts_the_reaction_time_again() -> None:
    state, first = _run(ProposerState(), PREFILL_HOT, range(0, 20))
    state, _ = _run(state, CALM, range(20, 21))
    _, proposals = _run(state, PREFILL_HOT, range(21, 60))
    assert first == [] and proposals == [(51, "decode->prefill")]


def test_inside_the_bands_nothing_is_pressed_or_given() -> None:
    assert pressed(CALM, SPEC)[0] is None
    # prefill pressed, but decode's ITL is inside its band (not below low): decode has no host to give
    half = Figures(prefill_queue_p95_ms=900, decode_itl_p95_ms=70, decode_kv_usage=0.4, hosts=HOSTS)
    assert pressed(half, SPEC)[0] is None
    both = Figures(prefill_queue_p95_ms=900, decode_itl_p95_ms=180, hosts=HOSTS)
    assert pressed(both, SPEC) == (None, pressed(both, SPEC)[1])
    assert pressed(both, SPEC)[1].startswith("both pools are pressed")
    assert pressed(Figures(hosts=HOSTS), SPEC)[0] is None  # no data: nothing to decide on


def test_no_flap_back_during_the_cool_down_and_a_move_back_needs_the_other_band() -> None:
    state, toward = _run(ProposerState(), PREFILL_HOT, range(0, 31))
    assert toward == [(30, "decode->prefill")]
    state, back = _run(state, DECODE_HOT, range(31, 330))  # decode pressed at once: still cooling down
    assert back == []
    _, proposal, why = propose(state, DECODE_HOT, SPEC, 329.0)
    assert proposal is None and "cooling down after the last proposal (1 s left)" in why
    _, back = _run(state, DECODE_HOT, range(330, 340))
    assert back == [(330, "prefill->decode")]


def test_the_giving_pool_keeps_its_minimum() -> None:
    spec = RebalanceSpec.model_validate({"mode": "dry-run", "reaction_s": 0, "minimums": {"decode": 3}})
    _, proposal, why = propose(ProposerState(), PREFILL_HOT, spec, 0.0)
    assert proposal is None and why.endswith("the decode pool has 3 host(s), its minimum is 3")
    one = Figures(**{**PREFILL_HOT.__dict__, "hosts": {"prefill": 1, "decode": 1}})
    _, proposal, why = propose(ProposerState(), one, RebalanceSpec(reaction_s=0), 0.0)
    assert proposal is None and "its minimum is 1" in why


COLOCATED = RebalanceSpec.model_validate(
    {"mode": "on", "reaction_s": 0, "colocated_queue_p95_ms": {"high": 500, "low": 100}}
)
WITH_COLOCATED = {"prefill": 1, "decode": 2, "colocated": 2}


def test_the_colocated_pool_takes_part_only_with_its_band() -> None:
    hot = Figures(
        prefill_queue_p95_ms=300, decode_itl_p95_ms=20, colocated_queue_p95_ms=900, hosts=WITH_COLOCATED
    )
    assert pressed(hot, SPEC)[0] is None  # no band: moves between the P/D pools only
    _, proposal, why = propose(ProposerState(), hot, COLOCATED, 0.0)
    assert proposal is not None and (proposal.source, proposal.target) == ("decode", "colocated")
    assert why.startswith("colocated queue P95 900 ms > 500 and decode has room")
    assert proposal.figures["colocated_queue_p95_ms"] == 900


def test_a_pressed_pd_pool_takes_a_host_from_a_colocated_pool_with_room() -> None:
    # prefill queueing, decode inside its band (no room to give), colocated idle
    figures = Figures(
        prefill_queue_p95_ms=900, decode_itl_p95_ms=70, colocated_queue_p95_ms=20, hosts=WITH_COLOCATED
    )
    _, proposal, why = propose(ProposerState(), figures, COLOCATED, 0.0)
    assert proposal is not None and (proposal.source, proposal.target) == ("colocated", "prefill")
    assert why.startswith("prefill queue P95 900 ms > 500 and colocated has room")
    # inside its own band, the colocated pool neither asks nor gives
    calm = Figures(
        prefill_queue_p95_ms=900, decode_itl_p95_ms=70, colocated_queue_p95_ms=300, hosts=WITH_COLOCATED
    )
    assert pressed(calm, COLOCATED)[0] is None

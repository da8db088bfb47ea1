"""Short streams beside long prefills, per request: the instance each went to (the gateway's header, else the
round robin inferred from the send order), which short streams decoded through a long prefill on their own
instance, their stalls."""

from __future__ import annotations

from pdfleet.bench.client import Record
from pdfleet.bench.overlap import (
    FEW_OVERLAPS,
    confidence_note,
    instances_of,
    round_robin,
    short_streams,
    stalls_during,
)


def _rec(i: int, cls: str, start: float, chunks: list[float]) -> Record:
    r = Record(i, "colocated", cls, 30000 if cls == "long" else 500, len(chunks), start=start, chunks=chunks)
    r.ttft = chunks[0] - start
    return r


def _mix() -> list[Record]:
    """Sent in this order: s0 s1 s2 s3 L4 s5 (two instances: s0 s2 L4 on one, s1 s3 s5 on the other).
    The long prompt prefills 1.0 -> 2.0; s0 and s1 decode through it, s0 on its instance with a 400 ms
    gap; s2 and s3 are done before it; s5 starts during it (it waits, then decodes undisturbed)."""
    ticks = [0.05 + 0.02 * k for k in range(120)]  # 0.05 .. 2.43
    s0 = [t if t < 1.2 else t + 0.4 for t in ticks]
    return [
        _rec(0, "short", 0.0, s0),
        _rec(1, "short", 0.01, [t + 0.01 for t in ticks]),
        _rec(2, "short", 0.1, [0.15, 0.17, 0.19]),
        _rec(3, "short", 0.2, [0.25, 0.27]),
        _rec(4, "long", 1.0, [2.0, 2.02]),
        _rec(5, "short", 1.5, [2.1, 2.12, 2.14]),
    ]


def test_round_robin_follows_the_send_order() -> None:
    recs = _mix()
    assert round_robin(list(reversed(recs)), 2) == {0: 0, 1: 1, 2: 0, 3: 1, 4: 0, 5: 1}
    assert set(round_robin(recs, 1).values()) == {0}


def test_only_short_streams_decoding_through_a_long_prefill_on_their_instance_count() -> None:
    got = short_streams(_mix(), colocated=True, instances=2, stall_ms=250)
    assert got["streams"] == 5 and got["long_prefills"] == 1
    assert got["overlapped_same_instance"] == 1  # s0 (s1 is on the other instance; s5 started inside)
    assert got["overlapped_in_pool"] == 2  # s0 and s1
    assert got["stalls"] == got["overlapped_stalls"] == 1 and round(got["worst_gap_ms"]) == 420
    assert got["stalls_per_100_streams"] == 20.0
    assert got["stalls_during_long_prefill"] == 1  # s0's 420 ms gap (1.19 -> 1.61) met the prefill 1.0 -> 2.0
    pd = short_streams(_mix(), colocated=False, instances=1, stall_ms=250)
    assert pd["overlapped_same_instance"] == 0 and pd["overlapped_in_pool"] == 2
    assert str(pd["attribution"]).startswith("prefill and decode on separate instances")


def test_only_stalls_whose_gap_met_a_long_prefill_on_the_instance_count_as_caused_by_it() -> None:
    """The gateway's definition: a stall counts when a long prefill ran on the stream's instance at some
    point in the gap (not every stall of a stream that overlapped one)."""
    ticks = [0.05 + 0.02 * k for k in range(100)]
    late = [t if t < 0.5 else t + 0.4 for t in ticks]  # a 420 ms gap 0.49 -> 0.91: before the prefill
    both = [t if t < 1.2 else t + 0.4 for t in late]  # and another 1.59 -> 2.01: during it
    recs = [_rec(0, "short", 0.0, both), _rec(1, "long", 1.0, [2.0, 2.02]), _rec(2, "short", 0.0, both)]
    where = {0: 0, 1: 0, 2: 1}
    assert stalls_during(recs, where, 0.25) == 1  # s0's second gap; s2 is on the other instance
    assert stalls_during(recs, where, 0.5) == 0  # over the gateway's threshold: none
    assert stalls_during(recs, {**where, 2: 0}, 0.25) == 2
    assert short_streams(recs, True, 2, 250)["overlapped_stalls"] == 2  # both of s0's, the one before too


def test_few_overlaps_come_with_a_confidence_note() -> None:
    got = short_streams(_mix(), colocated=True, instances=2, stall_ms=250)
    assert "only 1 short stream(s) on the colocated pool" in str(confidence_note("colocated", got))
    assert confidence_note("colocated", {**got, "overlapped_same_instance": FEW_OVERLAPS}) is None
    assert confidence_note("disagg", short_streams(_mix(), False, 1, 250)) is None


def test_the_gateways_header_names_the_instance_whatever_the_send_order() -> None:
    """prefix_load put s1 beside the long prompt (send order says the other instance): it counts."""
    recs = _mix()
    for r, where in zip(recs, (0, 0, 1, 1, 0, 1), strict=True):
        r.instance = where
    assert instances_of(recs, 2) == ({0: 0, 1: 0, 2: 1, 3: 1, 4: 0, 5: 1}, True)
    got = short_streams(recs, colocated=True, instances=2, stall_ms=250)
    assert got["overlapped_same_instance"] == 2 and got["overlapped_in_pool"] == 2
    assert got["attribution"] == "instance from the gateway's header (2 instances)"
    inferred = short_streams(_mix(), colocated=True, instances=2, stall_ms=250)
    assert inferred["attribution"] == "round robin over 2 instances, inferred from the send order"
    assert instances_of(_mix(), 2) == (round_robin(_mix(), 2), False)

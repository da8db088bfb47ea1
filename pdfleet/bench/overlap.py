"""Short streams beside long prefills: the guide's effect, counted per request and per instance.

The guide's case: a short stream stops for as long as a long prompt's prefill chunks hold the GPU it
decodes on. So what the bench counts, per pool, is the short streams whose decode span (first to last
content event) overlaps a long request's prefill (its send to its first content event) **on the instance
that decodes them**, their stalls (gaps over `slo.stall_ms`) and their worst gap. A short stream that
starts during a long prefill waits for it (its TTFT grows) but then decodes undisturbed: it does not
overlap.

Which instance served a request: the gateway names it in each colocated response's X-Pdfleet-Instance
header (its position in the policy's list, also on a fallback), and the client records it; that is what
counts (`instance from the gateway's header`), whatever the gateway's colocated choice. A gateway that
sends no such header (one older than it) is taken to round-robin: the bench sends one pool's requests
alone, so the k-th request it routed went to instance k mod n, in the client's send order
(`round_robin`, `inferred from the send order`; wrong under `prefix_load`). On the P/D pool every
prefill runs on the prefill instance and every stream decodes on the decode instance: no short stream
shares an instance with a long prefill, by construction; the time overlap with a long prefill anywhere
in the pool is counted too (`in_pool`), to show that those streams went on through the same prefills.

Two stall counts of those streams: `overlapped_stalls`, every stall of a stream that overlapped (the
report's figure), and `stalls_during_long_prefill`, only the stalls whose gap itself met a long prefill
on the stream's instance: the gateway's "stalls caused by long prefills"
(`pdfleet_gateway_long_prefill_stalls_total`) counted from the client's side, so the two compare like
with like (`stalls_during`, at the gateway's own stall threshold).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pdfleet.bench.client import Record
from pdfleet.bench.stats import gaps

# Below this many same-instance overlaps, a pool's short-stream stall figures are a handful of events.
FEW_OVERLAPS = 10


def round_robin(records: Sequence[Record], instances: int) -> dict[int, int]:
    """Request index -> instance (0..n-1, relative to the run's first request) in send order."""
    order = sorted((r for r in records if math.isfinite(r.start)), key=lambda r: r.start)
    return {r.index: k % max(1, instances) for k, r in enumerate(order)}


def instances_of(records: Sequence[Record], instances: int) -> tuple[dict[int, int], bool]:
    """Request index -> colocated instance, and whether the gateway named them: the header's instance
    where any record has one (a request without one, e.g. failed before an answer, has none), else the
    round robin inferred from the send order."""
    named = {r.index: r.instance for r in records if r.instance is not None}
    if named:
        return named, True
    return round_robin(records, instances), False


def _prefill(rec: Record) -> tuple[float, float] | None:
    """A long request's prefill span as the client saw it: send to first content event."""
    if not rec.chunks:
        return None
    return rec.start, rec.chunks[0]


def _overlaps(stream: Record, spans: Sequence[tuple[float, float]]) -> bool:
    """Whether a stream's decode span (first to last content event) meets any of the spans."""
    if len(stream.chunks) < 2:
        return False
    first, last = stream.chunks[0], stream.chunks[-1]
    return any(lo < last and first < hi for lo, hi in spans)


def _meets(lo: float, hi: float, spans: Sequence[tuple[float, float]]) -> bool:
    return any(a < hi and lo < b for a, b in spans)


def stalls_during(
    records: Sequence[Record], where: dict[int, int], stall_s: float, scale: float = 1.0
) -> int:
    """Short streams' gaps over `stall_s` (the profile's seconds) during which a long prefill ran on the
    stream's own instance (`where`: request index -> instance): the gateway's stalls caused by long
    prefills, from the client's side."""
    spans: dict[int, list[tuple[float, float]]] = {}
    for r in records:
        if r.length_class == "long" and r.index in where and (s := _prefill(r)):
            spans.setdefault(where[r.index], []).append(s)
    n = 0
    for r in records:
        if r.length_class != "short" or not r.success or r.cancelled or r.index not in where:
            continue
        mine = spans.get(where[r.index], [])
        for prev, cur in zip(r.chunks, r.chunks[1:], strict=False):
            if (cur - prev) / scale > stall_s and _meets(prev, cur, mine):
                n += 1
    return n


def short_streams(
    records: Sequence[Record], colocated: bool, instances: int, stall_ms: float, scale: float = 1.0
) -> dict[str, float | int | str]:
    """Per pool: the short streams, how many overlapped a long prefill on their own instance (and in the
    pool), their stalls and worst gap (ms, the profile's time), and how the instance was known."""
    recs = [r for r in records if not r.cancelled]
    asked = [
        r for r in recs if r.length_class == "short"
    ]  # per 100 streams counts failed ones, as stats does
    short = [r for r in asked if r.success]
    longs = [r for r in recs if r.length_class == "long"]
    where, named = instances_of(recs, instances) if colocated else ({}, False)
    stall_s = stall_ms / 1000

    def spans(instance: int | None) -> list[tuple[float, float]]:
        return [
            s for r in longs if (instance is None or where.get(r.index) == instance) and (s := _prefill(r))
        ]

    every = spans(None)
    by_instance = {i: spans(i) for i in {*range(instances), *where.values()}} if colocated else {}
    same = [r for r in short if colocated and _overlaps(r, by_instance.get(where.get(r.index, -1), []))]
    in_pool = [r for r in short if _overlaps(r, every)]

    def stalls(rs: Sequence[Record]) -> int:
        return sum(1 for r in rs for g in gaps(r, scale) if g > stall_s)

    def worst(rs: Sequence[Record]) -> float:
        return 1000 * max((g for r in rs for g in gaps(r, scale)), default=math.nan)

    return {
        "streams": len(asked),
        "stalls": stalls(short),
        "stalls_per_100_streams": 100 * stalls(short) / len(asked) if asked else math.nan,
        "worst_gap_ms": worst(short),
        "overlapped_same_instance": len(same),
        "overlapped_stalls": stalls(same),
        "stalls_during_long_prefill": stalls_during(recs, where, stall_s, scale) if colocated else 0,
        "overlapped_worst_gap_ms": worst(same),
        "overlapped_in_pool": len(in_pool),
        "in_pool_stalls": stalls(in_pool),
        "long_prefills": len(every),
        "instances": instances,
        "attribution": (
            (
                f"instance from the gateway's header ({instances} instance{'s' if instances != 1 else ''})"
                if named
                else f"round robin over {instances} instances, inferred from the send order"
            )
            if colocated
            else "prefill and decode on separate instances: no short stream shares one with a prefill"
        ),
    }


def confidence_note(pool: str, figures: dict[str, float | int | str]) -> str | None:
    """A warning when a colocated pool's short-stream figures stand on few same-instance overlaps."""
    n = figures.get("overlapped_same_instance")
    if (
        not isinstance(n, int)
        or figures.get("attribution", "").__str__().startswith("prefill")
        or n >= FEW_OVERLAPS
    ):
        return None
    return (
        f"only {n} short stream(s) on the {pool} pool overlapped a long prefill on their own instance (fewer "
        f"than {FEW_OVERLAPS}): its short-stream stalls are too few events to judge; run longer "
        "(--duration) or with more documents (--long-share)"
    )

"""The automatic rebalance's decision, pure (issue 35): the pools' figures and what was proposed before in,
out at most one proposal (move one host from the pool with room to the pressed pool) with the numbers
behind it, or why not. The rollout controller measures the figures (rollout.pressure) and records every
proposal in its audit log; in dry run that is all it does (model.rebalancing says what the bands mean).

Hysteresis: a pool asks for a host only above its band's `high`, and gives one only below the other's
`low`; the pressure must last `reaction_s` in a row (a tick without it starts the count again); after a
proposal none for `cooldown_s` (so a move toward prefill is never followed by one back within it); the
giving pool keeps its minimum. Moves are between the prefill and decode pools first; with the profile's
`colocated_queue_p95_ms` band the colocated pool takes part too (pressed by its instances' queue time, it
takes a host from a P/D pool with room; with room, it gives one to a pressed P/D pool).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from pdfleet.model.rebalancing import RebalanceSpec


@dataclass(frozen=True)
class Figures:
    """The pools' figures over the window (None: no data: an idle pool, or a series it does not export)."""

    prefill_queue_p95_ms: float | None = None
    decode_itl_p95_ms: float | None = None
    decode_kv_usage: float | None = None  # the busiest decode instance's, 0..1
    decode_preemptions_per_min: float | None = None
    ttft_p95_ms: float | None = None  # the disaggregated pool's at the gateway: recorded, not deciding
    colocated_queue_p95_ms: float | None = None  # its instances' queue time (deciding with its band only)
    hosts: Mapping[str, int] = field(default_factory=dict)  # pool -> instances up


@dataclass(frozen=True)
class ProposerState:
    """What the proposer carries from tick to tick: the pool pressed since when, the last proposal."""

    pressed: str | None = None
    since: float | None = None
    last_at: float | None = None
    last_to: str | None = None


@dataclass(frozen=True)
class Proposal:
    """Move one host from `source` to `target`, because `why`, on these figures."""

    source: str
    target: str
    why: str
    figures: dict[str, object]


def pressed(figures: Figures, spec: RebalanceSpec) -> tuple[tuple[str, str] | None, str]:
    """The move that relieves a pressed pool from one with room, as (giving pool, pressed pool) (None:
    none, or both P/D pools pressed), and the numbers that say so. Between the P/D pools first; then, when
    the profile sets the colocated band, a pressed colocated pool from a P/D pool with room, or a pressed
    P/D pool from a colocated pool with room."""
    queue, itl = figures.prefill_queue_p95_ms, figures.decode_itl_p95_ms
    kv, pre = figures.decode_kv_usage, figures.decode_preemptions_per_min
    q, i, k = spec.prefill_queue_p95_ms, spec.decode_itl_p95_ms, spec.decode_kv_usage
    prefill_hot = queue is not None and queue > q.high
    prefill_room = queue is not None and queue < q.low
    decode_why = [
        text
        for hot, text in (
            (itl is not None and itl > i.high, f"decode ITL P95 {_n(itl)} ms > {i.high:g}"),
            (kv is not None and kv > k.high, f"decode KV usage {_n(kv)} > {k.high:g}"),
            (
                pre is not None and pre > spec.decode_preemptions_per_min,
                f"decode preemptions {_n(pre)}/min > {spec.decode_preemptions_per_min:g}",
            ),
        )
        if hot
    ]
    decode_room = (
        itl is not None
        and itl < i.low
        and (kv is None or kv < k.low)
        and (pre or 0.0) <= spec.decode_preemptions_per_min
    )
    shown = _shown(figures)
    if prefill_hot and decode_room:
        return (
            "decode",
            "prefill",
        ), f"prefill queue P95 {_n(queue)} ms > {q.high:g} and decode has room ({shown})"
    if decode_why and prefill_room:
        return ("prefill", "decode"), f"{'; '.join(decode_why)} and prefill has room ({shown})"
    if prefill_hot and decode_why:
        return None, f"both pools are pressed: no pool can give a host ({shown})"
    colocated = _colocated(figures, spec, prefill_hot, decode_why, prefill_room, decode_room, shown)
    if colocated is not None:
        return colocated
    return None, f"no pool pressed while the other has room ({shown})"


def _colocated(
    figures: Figures,
    spec: RebalanceSpec,
    prefill_hot: bool,
    decode_why: list[str],
    prefill_room: bool,
    decode_room: bool,
    shown: str,
) -> tuple[tuple[str, str], str] | None:
    """The colocated pool's part, when the profile sets its band (queue time P95 on its instances)."""
    band, queue = spec.colocated_queue_p95_ms, figures.colocated_queue_p95_ms
    if band is None or queue is None:
        return None
    if queue > band.high and (decode_room or prefill_room):
        giver = "decode" if decode_room else "prefill"
        return (
            giver,
            "colocated",
        ), f"colocated queue P95 {_n(queue)} ms > {band.high:g} and {giver} has room ({shown})"
    if queue < band.low and (prefill_hot or decode_why):
        want = "prefill" if prefill_hot else "decode"
        why = f"prefill queue P95 {_n(figures.prefill_queue_p95_ms)} ms > {spec.prefill_queue_p95_ms.high:g}"
        return (
            "colocated",
            want,
        ), f"{why if prefill_hot else '; '.join(decode_why)} and colocated has room ({shown})"
    return None


def propose(
    state: ProposerState, figures: Figures, spec: RebalanceSpec, now: float
) -> tuple[ProposerState, Proposal | None, str]:
    """This tick's state, proposal (None: none) and why."""
    move, why = pressed(figures, spec)
    if move is None:
        return ProposerState(None, None, state.last_at, state.last_to), None, why
    source, target = move  # the pressure counts for the pressed pool, whichever pool has room to give
    since = state.since if state.pressed == target and state.since is not None else now
    held = ProposerState(target, since, state.last_at, state.last_to)
    if now - since < spec.reaction_s:
        return held, None, f"{why}; pressed {now - since:.0f} of {spec.reaction_s:g} s"
    if state.last_at is not None and now - state.last_at < spec.cooldown_s:
        left = spec.cooldown_s - (now - state.last_at)
        return held, None, f"{why}; cooling down after the last proposal ({left:.0f} s left)"
    least = next((n for pool, n in spec.minimums.items() if pool == source), 1)
    have = figures.hosts.get(source, 0)
    if have - 1 < least:
        return held, None, f"{why}; the {source} pool has {have} host(s), its minimum is {least}"
    proposal = Proposal(source, target, why, asdict(figures) | {"hosts": dict(figures.hosts)})
    return ProposerState(None, None, now, target), proposal, why


def _n(value: float | None) -> str:
    """A figure as the audit line shows it: whole numbers from 100 up, three digits below."""
    if value is None:
        return "n/a"
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _shown(f: Figures) -> str:
    """Every figure, for the audit line and the reason."""
    parts = [
        ("prefill queue P95", f.prefill_queue_p95_ms, " ms"),
        ("decode ITL P95", f.decode_itl_p95_ms, " ms"),
        ("decode KV usage", f.decode_kv_usage, ""),
        ("decode preemptions/min", f.decode_preemptions_per_min, ""),
        ("TTFT P95", f.ttft_p95_ms, " ms"),
    ]
    if f.colocated_queue_p95_ms is not None:
        parts.append(("colocated queue P95", f.colocated_queue_p95_ms, " ms"))
    return ", ".join(f"{name} {_n(v)}{unit if v is not None else ''}" for name, v, unit in parts)

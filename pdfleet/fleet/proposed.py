"""The automatic rebalance's moves, made from the control machine (issue 35), pure: which of the rollout
controller's proposals to carry out, with which host, or which interrupted one to resolve.

The controller on the monitoring host measures and proposes (`rollout.rebalance.mode: on`, its audit log's
`rebalance-proposal` lines); it cannot provision (no SSH keys there, by design). `invoke rebalance
--proposed` (one look) or `--follow` (a loop) on the control machine reads those lines and the live
layout's audit log (on the gateway hosts) and asks `next_action`:

- only the newest proposal is ever considered (an older one not carried out was superseded by it);
- a proposal is carried out at most once: the task records `proposal-taken` (with the proposal's time) in
  the live layout's audit log before its move starts, and an end line (`moved` naming the proposal,
  `proposal-stopped`, `proposal-failed`, `proposal-skipped`, `proposal-resolved`) after it;
- a proposal taken with no end line was interrupted (the task died mid-move): it is resolved, never carried
  out again: the fleet is converged to the live layout, which names the host in its old pool (the move
  stopped before its render step: it is admitted there again) or its new one (the move is finished);
- a proposal older than `act_within_s` is skipped (the pressure behind it is no longer measured), and so is
  one that no host can carry out (the giving pool at its minimum in the live layout, say), with why.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pdfleet.errors import ValidationError
from pdfleet.fleet.mover import Layout
from pdfleet.fleet.replan import Move, counts_of, moves_toward

PROPOSAL_EVENT = "rebalance-proposal"  # the controller's audit line (rollout.pressure.EVENT)
TAKEN = "proposal-taken"
ENDS = ("moved", "proposal-stopped", "proposal-failed", "proposal-skipped", "proposal-resolved")
FOLLOW_FAILURES = 5  # looks in a row failing on a transient error before `--follow` stops
FOLLOW_PAUSE_MOST_S = 120.0  # the longest pause between such looks


@dataclass(frozen=True)
class Proposal:
    """One of the controller's proposals: move one host from `source` to `target`, proposed at `at`."""

    at: float
    source: str
    target: str
    why: str

    @property
    def key(self) -> str:
        """How the live layout's audit log names it (its time, as the controller recorded it)."""
        return f"{self.at:.3f}"


@dataclass(frozen=True)
class Action:
    """What to do now: `carry` the move, `skip` the proposal (why), `resolve` an interrupted one (its
    move, as taken), or `none` (why)."""

    kind: Literal["carry", "skip", "resolve", "none"]
    why: str
    proposal: Proposal | None = None
    move: Move | None = None
    key: str = ""  # the proposal's key in the audit logs ("" for none)


def proposals_in(history: Iterable[Mapping[str, Any]]) -> list[Proposal]:
    """The proposals to act on in the controller's audit log, oldest first (`mode: on` only: a dry run's
    are records, never moves)."""
    out = []
    for event in history:
        if event.get("event") != PROPOSAL_EVENT or event.get("mode") != "on":
            continue
        try:
            out.append(Proposal(float(event["at"]), str(event["from"]), str(event["to"]), str(event["why"])))
        except (KeyError, TypeError, ValueError):
            continue  # not a proposal this release wrote: nothing to act on
    return sorted(out, key=lambda p: p.at)


def audit_events(texts: Iterable[str]) -> list[dict[str, Any]]:
    """The live layout's audit lines, from every gateway host's log (a torn or foreign line is skipped)."""
    events = []
    for text in texts:
        for line in text.splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(event, dict):
                events.append(event)
    return events


def next_action(
    proposals: list[Proposal],
    audit: list[dict[str, Any]],
    layout: Layout,
    initial: Layout,
    now: float,
    act_within_s: float,
) -> Action:
    """What to do about the controller's proposals now (see the module docstring)."""
    taken = {str(e.get("proposal")): e for e in audit if e.get("event") == TAKEN}
    ended = {str(e.get("proposal")) for e in audit if e.get("event") in ENDS and "proposal" in e}
    for key, event in taken.items():
        if key not in ended:
            move = Move(str(event["host"]), str(event["from"]), str(event["to"]), str(event.get("why", "")))
            proposal = next((p for p in proposals if p.key == key), None)
            return Action("resolve", "taken and its move not finished", proposal, move, key)
    if not proposals:
        return Action("none", "the controller has proposed no move")
    newest = proposals[-1]
    if newest.key in taken or newest.key in ended:
        return Action(
            "none", f"the newest proposal ({newest.key}) was handled already", newest, key=newest.key
        )
    age = now - newest.at
    if age > act_within_s:
        return Action(
            "skip",
            f"proposed {age:.0f} s ago, more than rollout.rebalance.act_within_s ({act_within_s:g} s): "
            "the pressure behind it is no longer measured",
            newest,
            key=newest.key,
        )
    counts = counts_of(layout)
    counts[newest.source] -= 1
    counts[newest.target] += 1
    try:
        moves = moves_toward(layout, counts, initial)
    except ValidationError as exc:
        return Action(
            "skip", f"no host can move {newest.source} -> {newest.target}: {exc}", newest, key=newest.key
        )
    if len(moves) != 1:  # one host from one pool to another: one move, or the layout is not one host a pool
        why = f"{newest.source} -> {newest.target} is not one move on this layout"
        return Action("skip", why, newest, key=newest.key)
    return Action("carry", f"proposed {age:.0f} s ago: {newest.why}", newest, moves[0], newest.key)


def taken_event(action: Action) -> dict[str, Any]:
    """The audit line written before the proposal's move starts."""
    assert action.proposal is not None and action.move is not None
    m = action.move
    return {
        "event": TAKEN,
        "proposal": action.key,
        "host": m.host,
        "from": m.source,
        "to": m.target,
        "why": m.why,
        "proposed": action.proposal.why,
    }


def where_now(layout: Layout, move: Move) -> str:
    """Where an interrupted move's host is in the live layout: `source` (its move stopped before the
    render step: admit it there again), `target` (render reached: converge to finish it), or `elsewhere`."""
    pools = layout.hosts.get(move.host, ())
    if move.target in pools:
        return "target"
    if move.source in pools:
        return "source"
    return "elsewhere"


def retry_pause(failures: int, every_s: float) -> float | None:
    """`--follow` after `failures` looks in a row failed on a transient error (an SSH hiccup, Prometheus
    not answering): seconds before the next look, doubling from `every_s` up to FOLLOW_PAUSE_MOST_S (or
    `every_s` when that is longer), or None: stop, after FOLLOW_FAILURES."""
    if failures >= FOLLOW_FAILURES:
        return None
    return min(every_s * 2**failures, max(FOLLOW_PAUSE_MOST_S, every_s))

"""The per-request decision, pure: policy in, facts in, target and exactly one reason out (issue 32).

Like rollout/gates.py, nothing here reads a clock, a socket or a counter: the gateway gathers the facts
(the prefix index, the load poller, its own outstanding prompt tokens) and this module decides, so each
reason has a unit test and the decision's cost is measurable alone.

The order, and the reason each step gives:
1. a forced pool (the override header) wins: `forced_header`;
2. the colocated instance is chosen (round robin, or prefix-affine, load- and stream-aware: the policy's
   choice, or the one the request asked for in the choice header), and the request's length class is
   taken from its whole prompt or from what that instance would still have to prefill (the policy's
   threshold_on, or the one the request asked for in the threshold header);
3. the sticky bucket against the stage's percentage for that class: outside the share the request
   stays colocated as `short` (a long prompt in that bucket would have gone), `cached_prefix` (its
   whole prompt would have gone, its uncached part does not) or `stage_weight` (not even a long one);
4. in the share: `no_pd_pool` (the alias has none), `endpoint_not_carried` (the P/D router cannot carry
   the endpoint), `prefill_busy` / `decode_busy` (a bound the policy sets is passed, or the figure is
   unknown: stale facts are never taken as idle);
5. else the P/D pool: `stage_weight`.
`fallback` is not decided here: the proxy gives it to a request the P/D pool failed before its first
byte and the colocated pool served.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from pdfleet.model.routing import ColocatedChoice, DeciderSpec, ThresholdOn
from pdfleet.model.stages import StageSpec

Reason = Literal[
    "forced_header",
    "stage_weight",
    "short",
    "cached_prefix",
    "prefill_busy",
    "decode_busy",
    "endpoint_not_carried",
    "no_pd_pool",
    "fallback",
]
REASONS: tuple[Reason, ...] = get_args(Reason)  # the closed set, in its documented order
PoolName = Literal["colocated", "disagg"]
ClassName = Literal["short", "long"]


@dataclass(frozen=True)
class Load:
    """One P/D instance's queue as last scraped: requests waiting, and how old that figure is (None:
    never scraped, or the last scrape failed)."""

    waiting: int | None
    age_s: float | None

    def known(self, stale_s: float) -> int | None:
        """The figure when it is fresh, else None (unknown: never idle)."""
        if self.waiting is None or self.age_s is None or self.age_s > stale_s:
            return None
        return self.waiting


@dataclass(slots=True)
class Facts:
    """What the gateway knows about one request and the pools when it decides.

    `cached`, `outstanding` and `serving` have one entry per colocated instance, in the route's order:
    the prompt tokens the gateway estimates that instance has cached, the prompt tokens it has been
    sent and not yet prefilled (sent, no first byte yet), and the requests it is serving (prefilling or
    decoding: sent, not yet ended; empty: none counted). `rr` is the route's round-robin counter;
    `choice` the colocated choice the request asked for, `threshold_on` what it asked its length class be
    taken from (None: the policy's).
    Not frozen (nor Verdict): a frozen dataclass's __init__ costs several microseconds per request.
    """

    tokens: int
    bucket: int
    cached: Sequence[int]
    outstanding: Sequence[int]
    rr: int
    has_pd_pool: bool = False
    endpoint_carried: bool = True
    forced: PoolName | None = None
    prefill: Sequence[Load] = ()
    decode: Sequence[Load] = ()
    choice: ColocatedChoice | None = None
    threshold_on: ThresholdOn | None = None
    serving: Sequence[int] = ()


@dataclass(slots=True)
class Verdict:
    """Where one request goes: a pool (and which colocated instance; its index in the route), its
    length class, the tokens the class was taken from, and why."""

    pool: PoolName
    instance: int
    cls: ClassName
    effective: int
    reason: Reason


def length_class(tokens: int, threshold: int) -> ClassName:
    """`long` at or past the threshold."""
    return "long" if tokens >= threshold else "short"


def choose_instance(spec: DeciderSpec, facts: Facts) -> int:
    """The colocated instance: the round robin's next, or (prefix_load) the one of least cost; ties go in
    round-robin order, so an idle pool with no cache still spreads. The request's own choice, when it
    asked, else the policy's.

    The cost is the prompt tokens every request it delays waits for: this one waits for the instance's
    outstanding prompt tokens and its own uncached ones; each request the instance is serving waits for
    those uncached ones too (it decodes in the same steps, now or once its own prefill is done). So a
    conversation stays where its prefix is cached, two long prefills do not stack on one instance while
    another idles, and a fresh prefill goes where fewer streams would stall behind it."""
    n = len(facts.cached)
    start = facts.rr % n
    if (facts.choice or spec.colocated_choice) == "round_robin" or n == 1:
        return start
    serving = facts.serving
    best, best_cost = start, -1
    for k in range(n):
        i = (start + k) % n
        uncached = max(0, facts.tokens - facts.cached[i])
        cost = facts.outstanding[i] + uncached * (1 + (serving[i] if serving else 0))
        if best_cost < 0 or cost < best_cost:
            best, best_cost = i, cost
    return best


def queue_past(loads: Sequence[Load], bound: int | None, stale_s: float) -> bool:
    """Past the bound: any instance's queue over it, or any figure unknown (a stopped instance); the
    decider's busy bypass and the shadow's P/D queue bound."""
    if bound is None:
        return False
    for load in loads:
        waiting = load.known(stale_s)
        if waiting is None or waiting > bound:
            return True
    return False


def decide(spec: DeciderSpec, stage: StageSpec, threshold: int, facts: Facts) -> Verdict:
    """The target and the one reason for a request (see the module docstring for the order)."""
    instance = choose_instance(spec, facts)
    cached = facts.cached[instance] if (facts.threshold_on or spec.threshold_on) == "effective" else 0
    effective = max(0, facts.tokens - cached)
    cls = length_class(effective, threshold)

    def colocated(reason: Reason) -> Verdict:
        return Verdict("colocated", instance, cls, effective, reason)

    if facts.forced is not None:
        return Verdict(facts.forced, instance, cls, effective, "forced_header")
    if facts.bucket >= getattr(stage, cls):
        if cls == "short" and facts.bucket < stage.long:
            whole = length_class(facts.tokens, threshold)
            return colocated("cached_prefix" if whole == "long" else "short")
        return colocated("stage_weight")
    if not facts.has_pd_pool:
        return colocated("no_pd_pool")
    if not facts.endpoint_carried:
        return colocated("endpoint_not_carried")
    if queue_past(facts.prefill, spec.prefill_busy_waiting, spec.stale_s):
        return colocated("prefill_busy")
    if queue_past(facts.decode, spec.decode_busy_waiting, spec.stale_s):
        return colocated("decode_busy")
    return Verdict("disagg", instance, cls, effective, "stage_weight")


def reason_shares(counts: Mapping[str, float]) -> list[tuple[str, float]]:
    """Each reason's share (0..1) of the requests counted (`pdfleet_gateway_decisions_total`'s increase
    per reason), in the documented order, a reason outside the set after them by name; reasons with no
    request left out; nothing counted: []."""
    total = sum(v for v in counts.values() if v > 0)
    if total <= 0:
        return []
    order: dict[str, int] = {r: i for i, r in enumerate(REASONS)}
    named = sorted((r for r, v in counts.items() if v > 0), key=lambda r: (order.get(r, len(order)), r))
    return [(r, counts[r] / total) for r in named]


def reason_mix_text(counts: Mapping[str, float]) -> str:
    """One line of the mix: `stage_weight 62%, cached_prefix 30%, short 8% of 412 requests` (a share
    under 1 % with a decimal, never shown as 0 %); nothing counted: `no request decided`."""
    shares = reason_shares(counts)
    if not shares:
        return "no request decided"
    total = sum(v for v in counts.values() if v > 0)
    parts = [f"{r} {100 * x:.1f}%" if x < 0.01 else f"{r} {100 * x:.0f}%" for r, x in shares]
    return f"{', '.join(parts)} of {total:.0f} requests"

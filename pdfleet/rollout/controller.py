"""One model's rollout controller (`pdfleet-rollout run` runs one per model: controllers.Controllers),
over that model's state directory, gates and stage (the policy's top level, or its model group). Each
tick: measure the gates (without the state lock, so an operator's command never waits for Prometheus),
then, holding the write turn the models share (the gateways' policy has one version for all of them),
ask every gateway which policy it runs, under the lock advance the state machine on the freshly read
state and save it, then bring every gateway to the saved version and confirm.

Every transition is written ahead: the new version is saved (the intent) before any gateway is
written, each gateway write is recorded before and after it is sent, and the version counts as applied
only once every gateway reports it. A controller killed at any point finds on restart a state whose
version is at or above every version it wrote, and resumes: gateways behind are brought up to it.

A gateway that cannot be reached (or runs a policy the controller did not write) halts the rollout:
no step is applied until every gateway reports the same version again (no split brain). With no
rollout active, a higher version on every gateway (`invoke provision --stage S`) is adopted as the
stable stage. An abort is acted on within a poll interval whatever the metrics source does.

A shadow step's run (shadow_step) goes the same way: the state saved with the run it wants (and
`shadow_live`) before any gateway is sent a start; every tick brings the gateways' shadow runs to the
saved state, so an end, a pause, an abort or a restart leaves none of the controller's running.

With several models, a version above a model's own that the controller wrote for another model, over
this model's unchanged stage, is this model's (reconcile.as_seen_by); a new version is numbered above
every version any model or gateway holds (reconcile.lifted), and a lower version another model saved is
written first (reconcile.peer_pending), so the gateways take versions in the order they were saved.

With `rollout.rebalance.mode` on (dry-run), each loop also asks the automatic rebalance (rollout.pressure)
after the rollout's tick, which records its proposals in the same audit log.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pdfleet.errors import PdfleetError
from pdfleet.metrics.source import MetricsSource
from pdfleet.model.stages import StageSpec
from pdfleet.rollout.config import ControllerConfig
from pdfleet.rollout.gates import GateResult, evaluate_gate
from pdfleet.rollout.gateways import GatewayClient, GatewayReport
from pdfleet.rollout.machine import (
    ACTIVE,
    Event,
    RolloutState,
    Tick,
    advance,
    gated_classes,
    initial_state,
    mismatch,
    on_mismatch,
    with_shadow,
)
from pdfleet.rollout.measure import observe
from pdfleet.rollout.pressure import AutoRebalancer
from pdfleet.rollout.reconcile import (
    as_seen_by,
    blind_results,
    confirm,
    lifted,
    may_write,
    peer_pending,
    reconcile_reports,
    resuming,
)
from pdfleet.rollout.shadow_step import ShadowWriter, measure_shadow, shadow_scope
from pdfleet.rollout.store import Store

log = logging.getLogger("pdfleet.rollout")

POLL_S = 0.1  # how often a waiting controller looks for an abort in the state file


@dataclass
class Controller:
    """One model's controller over the fleet's gateways, that model's metrics and its state directory."""

    config: ControllerConfig
    source: MetricsSource
    gateways: GatewayClient
    store: Store
    clock: Callable[[], float] = time.time
    # the other models' saved states (several models share the gateways' one policy version)
    peers: Callable[[], list[RolloutState]] = lambda: []
    # held to read the gateways, number a version and write it: one model at a time (controllers.Controllers)
    writing: threading.Lock = field(default_factory=threading.Lock)
    _started: bool = field(default=False, init=False)
    _inflight: threading.Thread | None = field(default=None, init=False)
    _last_error: str = field(default="", init=False)
    _abort_ticked: bool = field(default=False, init=False)  # the last tick began with an abort pending
    shadows: ShadowWriter = field(init=False)
    rebalancer: AutoRebalancer | None = field(default=None, init=False)  # rollout.rebalance.mode on

    def __post_init__(self) -> None:
        c = self.config
        self.shadows = ShadowWriter(
            self.gateways, c.gateways, self.store, lambda: self.clock(), c.name, c.group
        )
        if c.rollout.rebalance.mode != "off":
            self.rebalancer = AutoRebalancer(
                c.rollout.rebalance, self.source, self.store, self.clock, c.model
            )

    # ---- the loop --------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Tick every `rollout.interval_s` until `stop` is set (at once on an abort); a failing tick is
        logged (an operator's error in one line, once while it lasts), never fatal."""
        interval = self.config.rollout.interval_s
        while not stop.is_set():
            started = time.monotonic()
            try:
                self.tick()
                self._last_error = ""
            except (PdfleetError, OSError) as exc:
                message = str(exc).replace("\n", "; ")
                if message != self._last_error:
                    log.error("rollout tick failed: %s", message)
                self._last_error = message
            except Exception:  # the controller keeps going: the next tick starts from the saved state
                log.exception("rollout tick failed")
            if self.rebalancer is not None:  # after the rollout's tick, whatever it did: never holds one up
                self.rebalancer.tick()
            self._wait(stop, interval - (time.monotonic() - started))

    def _wait(self, stop: threading.Event, seconds: float) -> None:
        """Sleep until the next tick, or less: until stopped or an abort waits to be acted on."""
        deadline = time.monotonic() + seconds
        while not stop.is_set() and time.monotonic() < deadline:
            # an abort the last tick saw and could not act on (a gateway down) waits for the next tick
            if not self._abort_ticked and self._abort_pending():
                return
            stop.wait(min(POLL_S, max(0.0, deadline - time.monotonic())))

    def _abort_pending(self) -> bool:
        """An abort the operator asked for and no tick has acted on yet (read without the lock: the
        state file is replaced in one rename)."""
        try:
            state = self.store.load()
        except PdfleetError:
            return False
        return state is not None and state.abort and state.phase in ACTIVE

    def tick(self) -> RolloutState:
        """One reconcile step: measure (unlocked), then, holding the write turn shared by every model's
        controller, read the gateways, decide and save (locked), write the gateways."""
        with self.store.locked():
            seen = self.store.load()
        self._abort_ticked = seen is not None and seen.abort
        measured = self._measured(seen) if seen is not None else Tick(self.clock())
        with self.writing:  # one model at a time reads, numbers and writes the shared policy version
            raw, problem = self._reports()
            peers = self.peers()
            if seen is None:
                seen = self._initial(raw)
            written = max([seen.version, *(p.version for p in peers)])
            if not self._started and problem is None:
                self._started = True
                self._record(resuming(seen, as_seen_by(seen, raw, written), self.clock()))
            with self.store.locked():
                state = self.store.load() or seen
                if not _same_rollout(state, seen):  # the operator submitted meanwhile: measured for another
                    measured = Tick(measured.now)
                written = max(written, state.version)
                reports = as_seen_by(state, raw, written)
                floor = max([written, *(r.version for r in raw)])
                state, events = self._reconcile(state, reports, problem, measured, floor)
                self.store.save(state)  # the intent: saved before any gateway is written
                self.store.record(events)
            self._log(events)
            if may_write(state, reports, problem) and not peer_pending(state, peers):
                state = self._apply(state, reports, max(written, state.version))
            state, events = self.shadows.apply(state)  # the shadow run the saved state wants
            self._record(events)
        return state

    # ---- pieces ----------------------------------------------------------------------------

    def _reports(self) -> tuple[list[GatewayReport], str | None]:
        """Every gateway's report of this model's group (the top level: None), or the first problem (an
        unreachable gateway, a policy without the group)."""
        reports = []
        for target in self.config.gateways:
            try:
                reports.append(self.gateways.report(target, self.config.group))
            except PdfleetError as exc:
                return reports, str(exc)
        return reports, None

    def _initial(self, reports: list[GatewayReport]) -> RolloutState:
        """The first state: what the gateways run (or the profile's initial stage when none answers)."""
        if reports:
            top = max(reports, key=lambda r: r.version)
            return initial_state(top.stage, top.weights, top.version).model_copy(
                update={"applied_version": min(r.version for r in reports)}
            )
        stage = self.config.initial_stage
        return initial_state(stage, self.config.stages[stage], 1)

    def _measured(self, state: RolloutState) -> Tick:
        """The gates measured for this tick, in a thread bounded by `measure_timeout_s`, given up at
        once when an abort arrives (it needs no measurement). A source that does not answer in time
        is a metrics error on every gate (the rollout is blind), never a wait holding anything."""
        now = self.clock()
        if (
            state.phase not in ACTIVE
            or state.abort
            or mismatch(state, self.config.rollout, self.config.stages)
        ):
            return Tick(now)
        if self._inflight is not None and self._inflight.is_alive():
            return Tick(now, self._blind(state, "the previous measurement has not returned"))
        box: dict[str, Any] = {}

        def work() -> None:
            try:
                box["got"] = self.measure(state)
            except Exception as exc:  # a failing source is a measurement error, not a dead controller
                box["error"] = str(exc) or type(exc).__name__

        self._inflight = threading.Thread(target=work, name="rollout-measure", daemon=True)
        self._inflight.start()
        deadline = time.monotonic() + self.config.measure_timeout_s
        while self._inflight.is_alive():
            if self._abort_pending():
                return Tick(now)
            if time.monotonic() > deadline:
                why = f"no answer within {self.config.measure_timeout_s:g} s"
                return Tick(now, self._blind(state, why))
            self._inflight.join(POLL_S)
        if "error" in box:
            return Tick(now, self._blind(state, box["error"]))
        results, samples = box["got"]
        return Tick(now, results, samples)

    def _reconcile(
        self,
        state: RolloutState,
        reports: list[GatewayReport],
        problem: str | None,
        measured: Tick,
        floor: int,
    ) -> tuple[RolloutState, list[Event]]:
        """The state after this tick, with the shadow run it wants; a new policy version is numbered
        above `floor` (lifted)."""
        state, events = self._decided(state, reports, problem, measured, floor)
        state, more = with_shadow(state, self.config.rollout, self.config.stages, measured.now)
        return state, events + more

    def _decided(
        self,
        state: RolloutState,
        reports: list[GatewayReport],
        problem: str | None,
        measured: Tick,
        floor: int,
    ) -> tuple[RolloutState, list[Event]]:
        now = measured.now
        config = self.config
        why = mismatch(state, config.rollout, config.stages)
        if why is not None:
            return lifted(
                state, floor, lambda s: on_mismatch(s, config.stages, why, now, config.initial_stage)
            )
        state, events, done = reconcile_reports(state, reports, problem, now)
        if done:
            return state, events
        if state.phase in ACTIVE and state.target is not None:
            plan = config.rollout.plans[state.target]
            state, more = lifted(
                state,
                floor,
                lambda s: advance(s, plan, config.rollout, config.stages, measured, config.initial_stage),
            )
            events += more
        return state, events

    def measure(self, state: RolloutState, moving: StageSpec | None = None) -> tuple[list[GateResult], int]:
        """Every gate's result for the classes the rollout moved (or, for a dry run, would move), at the
        live weights, or on a shadow step its gates on the shadow series; none moved: nothing to measure."""
        scope = shadow_scope(self.config, state) if moving is None else None
        if scope is not None:
            return measure_shadow(self.config, self.source, *scope)
        classes = self.gated(state, moving)
        if not classes:
            return [], 0
        spec = self.config.rollout
        config = self.config
        kv = (config.kv_transfer_histogram, config.kv_transfer_role)
        observed, samples = observe(
            self.source,
            spec.gates,
            state.weights,
            classes,
            spec.window_s,
            config.kv_transfer_metrics,
            model=config.model,
            kv=kv,
        )
        return [evaluate_gate(g, o, self.config.slo) for g, o in observed], samples

    def gated(self, state: RolloutState, moving: StageSpec | None = None) -> list[str]:
        """The length classes a measurement covers: those moved past the stable stage."""
        stable = self.config.stages.get(state.stable_stage, StageSpec(short=0, long=0))
        return gated_classes(moving or state.weights, stable)

    def _blind(self, state: RolloutState, why: str) -> list[GateResult]:
        gates, classes = shadow_scope(self.config, state) or (self.config.rollout.gates, self.gated(state))
        return blind_results(gates, classes, why)

    def _apply(self, state: RolloutState, reports: list[GatewayReport], highest: int) -> RolloutState:
        """Bring every gateway to the saved version, then confirm under the lock once every gateway
        reports it (a version every gateway already runs is confirmed with no write); `highest` is the
        highest version any model's state holds (as_seen_by)."""
        written, raw, problem = self._write(state, reports)
        confirmed = as_seen_by(state, raw, highest)
        names = [t.name for t in self.config.gateways]
        with self.store.locked():
            fresh = self.store.load() or state
            new, events = confirm(fresh, state.version, names, written, confirmed, problem, self.clock())
            if new != fresh:
                self.store.save(new)
            self.store.record(events)
        self._log(events)
        return new

    def _write(
        self, state: RolloutState, reports: list[GatewayReport]
    ) -> tuple[list[str], list[GatewayReport], str | None]:
        """POST the saved version to each gateway behind it, each write recorded before it is sent
        (so a write that reaches a gateway is in the audit log even if the controller dies on the
        way back) and after it is answered; then every gateway's report."""
        stages = {**self.config.stages, state.stage: state.weights}
        written: list[str] = []
        behind = [
            (t, r) for t, r in zip(self.config.gateways, reports, strict=True) if r.version != state.version
        ]
        if not behind:
            return written, reports, None
        try:
            for target, report in behind:
                write = {"gateway": target.name, "version": state.version, "stage": state.stage}
                self.store.record(
                    [{"at": self.clock(), "event": "write", "from_version": report.version, **write}]
                )
                self.gateways.apply(target, state.version, state.stage, stages, self.config.group)
                self.store.record([{"at": self.clock(), "event": "wrote", **write}])
                written.append(target.name)
        except PdfleetError as exc:
            return written, [], str(exc)
        confirmed, problem = self._reports()
        return written, confirmed, problem

    def _record(self, events: list[Event]) -> None:
        if events:
            self.store.record(events)
            self._log(events)

    def _log(self, events: list[Event]) -> None:
        for event in events:
            if event.get("event") not in ("measurement", "write", "wrote"):
                log.info("%s", _describe(event))


def _same_rollout(a: RolloutState, b: RolloutState) -> bool:
    """Both states are one rollout at one step and version (an operator's flag may differ)."""
    keys = ("phase", "target", "step_index", "version", "stable_stage")
    return all(getattr(a, k) == getattr(b, k) for k in keys)


def time_to_next_step(state: RolloutState, config: ControllerConfig, now: float) -> float | None:
    """Seconds until the current pause or analysis can end by itself (None: it waits for promote, or
    the plan is no longer in the profile)."""
    if state.phase not in ACTIVE or state.target not in config.rollout.plans:
        return None
    steps = config.rollout.plans[state.target].steps
    if state.step_index >= len(steps):
        return 0.0
    step: Any = steps[state.step_index]
    elapsed = now - state.step_started_at
    if hasattr(step, "pause"):
        return None if step.pause.duration_s is None else max(0.0, step.pause.duration_s - elapsed)
    held = getattr(step, "analysis", None) or getattr(step, "shadow", None)
    if held is not None:
        return max(0.0, held.min_duration_s - elapsed)
    return 0.0


def _describe(event: Event) -> str:
    """One log line for an event (no secrets: events never hold one)."""
    rest = ", ".join(f"{k}={v}" for k, v in event.items() if k not in ("at", "event", "results"))
    return f"{event.get('event')}: {rest}" if rest else str(event.get("event"))


def finite(value: float | None) -> float | None:
    """JSON-safe numbers (NaN and infinities become None)."""
    return value if value is not None and math.isfinite(value) else None

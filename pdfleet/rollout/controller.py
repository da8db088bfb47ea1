"""`pdfleet-rollout run`: the controller's loop. Each tick, under the state lock: ask every gateway which
policy it runs, measure the gates through the metrics source, advance the state machine, apply the
policy the state asks for to every gateway, and record what happened.

A gateway that cannot be reached (or runs a policy the controller did not write) halts the rollout:
no step is applied until every gateway reports the same version again (no split brain). With no
rollout active, a higher version on every gateway (`invoke provision --stage S`) is adopted as the
stable stage.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pdfleet.metrics.source import MetricsSource
from pdfleet.model.stages import StageSpec
from pdfleet.rollout.config import ControllerConfig
from pdfleet.rollout.gates import GateResult, evaluate_gate
from pdfleet.rollout.gateways import GatewayClient, GatewayError, GatewayReport
from pdfleet.rollout.machine import (
    ACTIVE,
    Event,
    RolloutState,
    Tick,
    advance,
    gated_classes,
    initial_state,
)
from pdfleet.rollout.measure import observe
from pdfleet.rollout.store import Store

log = logging.getLogger("pdfleet.rollout")


@dataclass
class Controller:
    """One controller over one fleet's gateways, metrics and state directory."""

    config: ControllerConfig
    source: MetricsSource
    gateways: GatewayClient
    store: Store
    clock: Callable[[], float] = time.time

    # ---- the loop --------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Tick every `rollout.interval_s` until `stop` is set; a failing tick is logged, never fatal."""
        interval = self.config.rollout.interval_s
        while not stop.is_set():
            started = time.monotonic()
            try:
                self.tick()
            except Exception:  # the controller keeps going: the next tick starts from the saved state
                log.exception("rollout tick failed")
            stop.wait(max(0.0, interval - (time.monotonic() - started)))

    def tick(self) -> RolloutState:
        """One reconcile step, saved and recorded."""
        with self.store.locked():
            state = self.store.load()
            reports, problem = self._reports()
            if state is None:
                state = self._initial(reports)
            state, events = self._reconcile(state, reports, problem)
            self.store.save(state)
            self.store.record(events)
        for event in events:
            if event.get("event") != "measurement":
                log.info("%s", _describe(event))
        return state

    # ---- pieces ----------------------------------------------------------------------------

    def _reports(self) -> tuple[list[GatewayReport], str | None]:
        """Every gateway's report, or the first problem (an unreachable gateway)."""
        reports = []
        for target in self.config.gateways:
            try:
                reports.append(self.gateways.report(target))
            except GatewayError as exc:
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

    def _reconcile(
        self, state: RolloutState, reports: list[GatewayReport], problem: str | None
    ) -> tuple[RolloutState, list[Event]]:
        now = self.clock()
        events: list[Event] = []
        if problem is not None:
            if state.phase in ACTIVE and state.phase != "halted":
                state = state.model_copy(update={"phase": "halted", "reason": f"halted: {problem}"})
                events.append({"at": now, "event": "halted", "reason": problem})
            return state, events
        foreign = [r for r in reports if r.version > state.version]
        if foreign and state.phase in ACTIVE:
            if state.abort:  # take what the top gateway runs, so the rollback outranks it everywhere
                top = max(foreign, key=lambda r: r.version)
                state = state.model_copy(
                    update={"version": top.version, "stage": top.stage, "weights": top.weights}
                )
            elif state.phase != "halted" or not state.reason.startswith("halted: foreign"):
                r = foreign[0]
                why = (
                    f"foreign policy: gateway {r.name} runs version {r.version} (stage {r.stage}), "
                    "not written by the controller (invoke provision --stage?); rollout.abort to go back"
                )
                state = state.model_copy(update={"phase": "halted", "reason": f"halted: {why}"})
                return state, [{"at": now, "event": "halted", "reason": why}]
            else:
                return state, []
        if state.phase == "halted":
            state = state.model_copy(update={"phase": "progressing", "reason": "every gateway answers again"})
            events.append({"at": now, "event": "resumed"})
        if state.phase not in ACTIVE:
            adopted = self._adopt(state, reports, now)
            if adopted is not None:
                return adopted
        state, more = self._advance(state, now)
        events += more
        state, more = self._apply(state, reports, now)
        return state, [*events, *more]

    def _adopt(
        self, state: RolloutState, reports: list[GatewayReport], now: float
    ) -> tuple[RolloutState, list[Event]] | None:
        """With no rollout active: gateways all at one higher version (set by provision) become stable."""
        versions = {(r.version, r.stage, r.weights) for r in reports}
        if len(versions) != 1:
            return None
        version, stage, weights = versions.pop()
        if version <= state.version:
            return None
        reason = f"adopted stage {stage} (version {version}) from the gateways"
        new = state.model_copy(
            update={
                "stage": stage,
                "weights": weights,
                "version": version,
                "applied_version": version,
                "stable_stage": stage,
                "reason": reason,
            }
        )
        return new, [{"at": now, "event": "adopted", "stage": stage, "version": version}]

    def _advance(self, state: RolloutState, now: float) -> tuple[RolloutState, list[Event]]:
        if state.phase not in ACTIVE or state.target is None:
            return state, []
        plan = self.config.rollout.plans[state.target]
        results, samples = self.measure(state)
        return advance(state, plan, self.config.rollout, self.config.stages, Tick(now, results, samples))

    def measure(self, state: RolloutState, moving: StageSpec | None = None) -> tuple[list[GateResult], int]:
        """Every gate's result for the classes the rollout moved (or, for a dry run, would move), at the
        live weights; none moved: nothing to measure."""
        stable = self.config.stages.get(state.stable_stage, StageSpec(short=0, long=0))
        classes = gated_classes(moving or state.weights, stable)
        if not classes:
            return [], 0
        spec = self.config.rollout
        observed, samples = observe(
            self.source, spec.gates, state.weights, classes, spec.window_s, self.config.kv_transfer_metrics
        )
        return [evaluate_gate(g, o, self.config.slo) for g, o in observed], samples

    def _stages(self, state: RolloutState) -> dict[str, StageSpec]:
        """The profile's stages plus the current step's, as the gateways get them."""
        return {**self.config.stages, state.stage: state.weights}

    def _apply(
        self, state: RolloutState, reports: list[GatewayReport], now: float
    ) -> tuple[RolloutState, list[Event]]:
        """Bring every gateway to the state's version; confirm only when every one reports it."""
        if all(r.version == state.version for r in reports):
            if state.applied_version != state.version:
                state = state.model_copy(update={"applied_version": state.version})
            return state, []
        events: list[Event] = []
        try:
            for target, report in zip(self.config.gateways, reports, strict=True):
                if report.version != state.version:
                    self.gateways.apply(target, state.version, state.stage, self._stages(state))
            confirmed = [self.gateways.report(t) for t in self.config.gateways]
        except GatewayError as exc:
            if state.phase in ACTIVE:
                state = state.model_copy(update={"phase": "halted", "reason": f"halted: {exc}"})
            events.append({"at": now, "event": "halted", "reason": str(exc), "version": state.version})
            return state, events
        if all(r.version == state.version for r in confirmed):
            state = state.model_copy(update={"applied_version": state.version})
            events.append(
                {
                    "at": now,
                    "event": "applied",
                    "version": state.version,
                    "stage": state.stage,
                    "weights": state.weights.model_dump(),
                    "gateways": [t.name for t in self.config.gateways],
                }
            )
        return state, events


def time_to_next_step(state: RolloutState, config: ControllerConfig, now: float) -> float | None:
    """Seconds until the current pause or analysis can end by itself (None: it waits for promote)."""
    if state.phase not in ACTIVE or state.target is None:
        return None
    steps = config.rollout.plans[state.target].steps
    if state.step_index >= len(steps):
        return 0.0
    step: Any = steps[state.step_index]
    elapsed = now - state.step_started_at
    if hasattr(step, "pause"):
        return None if step.pause.duration_s is None else max(0.0, step.pause.duration_s - elapsed)
    if hasattr(step, "analysis"):
        return max(0.0, step.analysis.min_duration_s - elapsed)
    return 0.0


def _describe(event: Event) -> str:
    """One log line for an event (no secrets: events never hold one)."""
    rest = ", ".join(f"{k}={v}" for k, v in event.items() if k not in ("at", "event", "results"))
    return f"{event.get('event')}: {rest}" if rest else str(event.get("event"))


def finite(value: float | None) -> float | None:
    """JSON-safe numbers (NaN and infinities become None)."""
    return value if value is not None and math.isfinite(value) else None

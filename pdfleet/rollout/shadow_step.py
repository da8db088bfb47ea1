"""A rollout plan's `shadow:` step (issue 33): the shadow series measured for the gates, the pure
decision of which gateway to send which shadow start or stop, and the controller's side that sends
them, written ahead like a policy version.

Measured: per shadowed class, each gate's figure on the shadow side (`shadow="true"`: the copy on the
disaggregated pool) against the primary side (`shadow="false"`: the same requests on the colocated
pool, at the same time), from the gateways' `pdfleet_gateway_shadow_*` series; TPOT and KV transfer
from vLLM's own series, as the other steps read them (they cover each pool's whole traffic in the
window). The samples are the shadows sent in the window.

Written: while the state wants a shadow run (`RolloutState.shadow`), every gateway not running it is
sent a start carrying the run's tag (`pdfleet-rollout/<model>/<key>`); once it wants none while
`shadow_live` says one of ours may run, every gateway running a run of ours is sent a stop for that
tag (a run the operator started by hand is left alone), and `shadow_live` is cleared once every gateway
reports none of ours. Before any start the state is saved with `shadow_live` set, and each write is in
the audit log before and after it is sent, so an abort, a resumed controller or a later tick stops
what a dead controller started; a gateway ends a run by itself at the step's deadline too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pdfleet.errors import PdfleetError
from pdfleet.metrics.source import MetricsError, MetricsSource, SeriesAbsent
from pdfleet.model.rollout import GateSpec, shadow_classes, shadow_gates
from pdfleet.rollout.config import ControllerConfig, GatewayTarget
from pdfleet.rollout.gates import GateResult, Observation, evaluate_gate
from pdfleet.rollout.gateways import GatewayClient
from pdfleet.rollout.machine import Event, RolloutState, ShadowWant, shadow_step
from pdfleet.rollout.measure import KV_SERIES, figure
from pdfleet.rollout.store import Store

SERIES = "pdfleet_gateway_shadow_"
SIDES = {"disagg": "true", "colocated": "false"}  # the gates' two pools: the shadow and its primary
HISTOGRAMS = {
    "ttft": SERIES + "ttft_seconds",
    "itl": SERIES + "chunk_gap_seconds",
    "request": SERIES + "request_duration_seconds",
}
TAG = "pdfleet-rollout"


def _match(cls: str, model: str | None) -> dict[str, str]:
    return {"length_class": cls, **({"model": model} if model is not None else {})}


def _sides(got: Mapping[tuple[str, ...], float]) -> dict[str, float | None]:
    return {pool: got.get((side,)) for pool, side in SIDES.items()}


def _outcomes(
    source: MetricsSource, window_s: float, cls: str, model: str | None
) -> dict[str, dict[str, float]]:
    """Shadowed requests per side and outcome in the window (absent: none yet)."""
    try:
        got = source.increase(
            SERIES + "requests_total", window_s, by=("shadow", "outcome"), match=_match(cls, model)
        )
    except SeriesAbsent:
        return {}
    out: dict[str, dict[str, float]] = {}
    for (side, outcome), n in got.items():
        out.setdefault(side, {})[outcome] = n
    return out


def shadow_figure(
    source: MetricsSource,
    gate: GateSpec,
    cls: str,
    window_s: float,
    model: str | None = None,
    kv: tuple[str, str] = KV_SERIES,
) -> dict[str, float | None]:
    """The gate's figure for the shadow (`disagg`) and its primary (`colocated`) in one class (latencies
    in ms, error rate a fraction, stalls per minute); MetricsError when the source fails."""
    if gate.metric in HISTOGRAMS:
        try:
            got = source.quantile(
                gate.quantile, HISTOGRAMS[gate.metric], window_s, by=("shadow",), match=_match(cls, model)
            )
        except SeriesAbsent:
            got = {}
        return {p: None if v is None else v * 1000.0 for p, v in _sides(got).items()}
    if gate.metric in ("tpot", "kv_transfer"):
        return figure(source, gate, cls, window_s, model, kv)
    counts = _outcomes(source, window_s, cls, model)
    totals = {p: sum(counts[s].values()) if s in counts else None for p, s in SIDES.items()}
    if gate.metric == "error_rate":
        return {
            p: None if not totals[p] else counts[s].get("error", 0.0) / (totals[p] or 1.0)
            for p, s in SIDES.items()
        }
    if gate.metric == "stalls":
        try:
            got = source.increase(
                SERIES + "stream_stalls_total", window_s, by=("shadow",), match=_match(cls, model)
            )
        except SeriesAbsent:
            got = {}
        stalls = _sides(got)
        return {p: None if totals[p] is None else (stalls[p] or 0.0) * 60.0 / window_s for p in SIDES}
    raise MetricsError(f"{gate.name}: a shadow has no {gate.metric}")


def observe_shadow(
    source: MetricsSource,
    gates: Sequence[GateSpec],
    classes: Sequence[str],
    window_s: float,
    model: str | None = None,
    kv: tuple[str, str] = KV_SERIES,
    kv_transfer_metrics: bool = True,
) -> tuple[list[tuple[GateSpec, Observation]], int]:
    """Every gate's observation per shadowed class (vLLM's per-pool figures once, under the first),
    and the shadows sent in the window (the samples)."""
    out: list[tuple[GateSpec, Observation]] = []
    samples = 0
    for i, cls in enumerate(classes):
        with contextlib.suppress(MetricsError):  # each gate below reports the error itself
            samples += int(sum(_outcomes(source, window_s, cls, model).get("true", {}).values()))
        for gate in gates:
            if gate.metric in ("tpot", "kv_transfer") and i > 0:
                continue
            if gate.metric == "kv_transfer" and not kv_transfer_metrics:
                continue
            try:
                got = shadow_figure(source, gate, cls, window_s, model, kv)
            except MetricsError as exc:
                out.append((gate, Observation(gate.name, cls, error=str(exc))))
                continue
            out.append((gate, Observation(gate.name, cls, got["disagg"], got["colocated"])))
    return out, samples


def shadow_scope(config: ControllerConfig, state: RolloutState) -> tuple[list[GateSpec], list[str]] | None:
    """The gates and classes a shadow step holds, when the rollout is on one (None otherwise)."""
    step = shadow_step(state, config.rollout)
    if step is None or state.target not in config.stages:
        return None
    return shadow_gates(step, config.rollout.gates), shadow_classes(step, config.stages[state.target])


def measure_shadow(
    config: ControllerConfig, source: MetricsSource, gates: list[GateSpec], classes: list[str]
) -> tuple[list[GateResult], int]:
    """A shadow step's gate results over the window, and its samples."""
    kv = (config.kv_transfer_histogram, config.kv_transfer_role)
    window = config.rollout.window_s
    observed, samples = observe_shadow(
        source, gates, classes, window, config.model, kv, config.kv_transfer_metrics
    )
    return [evaluate_gate(g, o, config.slo) for g, o in observed], samples


# ---- what to send ----------------------------------------------------------------------------


def tag_of(model: str | None, want: ShadowWant) -> str:
    """The tag a shadow step's run carries on the gateways."""
    return f"{prefix_of(model)}{want.key}"


def prefix_of(model: str | None) -> str:
    """Every tag of one model's controller starts with this."""
    return f"{TAG}/{model or '-'}/"


def shadow_writes(
    want: ShadowWant | None,
    model: str | None,
    group: str | None,
    docs: Mapping[str, Mapping[str, Any]],
    now: float,
) -> list[tuple[str, dict[str, Any]]]:
    """(gateway, body) of each POST /admin/shadow to send, from each gateway's status: a start where
    the wanted run is not running (another model's controller's run is waited for, never replaced), a
    stop of our own run where none is wanted or another of ours runs; nothing past the deadline."""
    prefix = prefix_of(model)
    writes: list[tuple[str, dict[str, Any]]] = []
    for name, doc in docs.items():
        tag = (doc.get("running") or {}).get("tag") or ""
        if want is None or want.until <= now:
            if tag.startswith(prefix):
                writes.append((name, {"action": "stop", "tag": tag}))
            continue
        mine = tag_of(model, want)
        if tag == mine or (tag.startswith(f"{TAG}/") and not tag.startswith(prefix)):
            continue
        body: dict[str, Any] = {
            "action": "start",
            "stage": want.stage,
            "share": want.share,
            "classes": want.classes,
            "minutes": max(want.until - now, 1.0) / 60.0,
            "tag": mine,
        }
        if group is not None:
            body["model"] = group
        writes.append((name, body))
    return writes


def none_of_ours(model: str | None, docs: Mapping[str, Mapping[str, Any]]) -> bool:
    """No gateway runs a shadow run this model's controller started."""
    prefix = prefix_of(model)
    return not any(((d.get("running") or {}).get("tag") or "").startswith(prefix) for d in docs.values())


# ---- sending it ------------------------------------------------------------------------------


@dataclass
class ShadowWriter:
    """The controller's side of shadow steps: brings every gateway's shadow run to the saved state."""

    client: GatewayClient
    targets: Sequence[GatewayTarget]
    store: Store
    clock: Callable[[], float]
    model: str | None = None  # the controller's model name (its tags)
    group: str | None = None  # its gateway policy group (the run's `model`)
    _last_error: str = ""

    def apply(self, state: RolloutState) -> tuple[RolloutState, list[Event]]:
        """Start or stop shadow runs as the state wants (nothing to do when it wants none and none of
        ours may run); a gateway that does not answer is an event, retried next tick."""
        if state.shadow is None and not state.shadow_live:
            return state, []
        try:
            docs = {t.name: self.client.shadow(t) for t in self.targets}
            writes = shadow_writes(state.shadow, self.model, self.group, docs, self.clock())
            by_name = {t.name: t for t in self.targets}
            for name, body in writes:
                what = {"gateway": name, "action": body["action"], "tag": body["tag"]}
                self.store.record([{"at": self.clock(), "event": "shadow_write", **what}])
                docs[name] = self.client.shadow(by_name[name], body)
                self.store.record([{"at": self.clock(), "event": "shadow_wrote", **what}])
        except PdfleetError as exc:  # recorded once while it lasts
            seen, self._last_error = self._last_error, str(exc)
            return state, [] if seen == str(exc) else [
                {"at": self.clock(), "event": "shadow_error", "reason": str(exc)}
            ]
        self._last_error = ""
        if state.shadow is not None or not none_of_ours(self.model, docs):
            return state, []
        with self.store.locked():
            fresh = self.store.load() or state
            if fresh.shadow is not None or not fresh.shadow_live:
                return fresh, []
            new = fresh.model_copy(update={"shadow_live": False})
            self.store.save(new)
        return new, [{"at": self.clock(), "event": "shadow_stopped", "gateways": list(docs)}]

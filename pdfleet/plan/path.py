"""The request's path, pure: what a client's TTFT holds besides the engines' own (client, TLS, gateway,
bridge, for P/D the router and its hop between prefill and decode), per route, with where the figure came
from and when.

The prediction adds it to every first token (and so to E2E) of the route's requests: ITL and TPOT are the
engines' gaps and do not move. A path is not one figure: most requests pass in a few milliseconds, some
wait behind the machine's other work, and a short prompt's TTFT P95 (~25 ms) feels that tail. So a route's
path is its measured samples, dealt to the route's requests in arrival order (the i-th request gets sample
i mod n: the prediction's TTFTs are the engines' convolved with the measured path, deterministically). Its
figures are a measurement, never a constant in code:

- measured on the fleet (`invoke plan --measure-path`, and first thing in `--validate`): a burst of minimal
  requests (max_tokens 1, the smallest prompt) one at a time per route through the gateway; each sample is
  a request's client TTFT minus the mean the instances themselves recorded over the burst
  (`vllm:time_to_first_token_seconds`, sum over count of its /metrics delta: exact for a mean; P/D: the
  prefill's plus the decode's, which waits for the KV). A route whose instances counted other requests than
  the burst's in the window is not measured (its own figure would mix them in) and says so;
- given by the operator for a plan without a fleet (the profile's `plan.request_path`, with its source):
  one figure a route;
- with neither, 0 and the report says the path is not modelled.

Units: the prediction and the bench are in simulated seconds (a simulator's client times divided by its
`time_scale`), the path is wall time (nothing in it is simulated). So on a fleet at time scale s the
client's TTFT is s x the engines' simulated TTFT plus the path's wall time, the bench reports it divided by
s, and a sample (client TTFT / s minus the instances' own, simulated) is the path's wall time / s: what the
bench's figures carry, hence what the prediction adds. `time_scale` keeps s, the text says so and gives the
wall figure (x s); the profile's figures are wall milliseconds, divided by its time scale likewise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pdfleet.plan.gaps import TTFT, Deltas

ROUTES = ("colocated", "disagg")  # the pools a request takes: colocated, or P/D (router, prefill, decode)
ROLES = {"colocated": ("colocated",), "disagg": ("prefill", "decode")}  # whose TTFTs the engines account


@dataclass(frozen=True)
class RequestPath:
    """Milliseconds a route's first tokens spend outside the engines (its samples; none: 0), where those
    figures came from, when."""

    colocated_ms: tuple[float, ...] = ()
    disagg_ms: tuple[float, ...] = ()
    source: str = "not modelled"
    at: str | None = None  # UTC time of the measurement (or the profile's, as its source says)
    modelled: bool = False
    time_scale: float = 1.0  # the simulator's (wall s a simulated s): the samples are the wall path / it

    def samples(self, route: str) -> tuple[float, ...]:
        return self.disagg_ms if route == "disagg" else self.colocated_ms

    def seconds(self, route: str, i: int = 0) -> float:
        """The path of the i-th request (in arrival order) of `route` (colocated or disagg), in seconds."""
        xs = self.samples(route)
        return xs[i % len(xs)] / 1000 if xs else 0.0

    def mean_ms(self, route: str) -> float:
        xs = self.samples(route)
        return sum(xs) / len(xs) if xs else 0.0

    def p95_ms(self, route: str) -> float:
        xs = sorted(self.samples(route))
        return xs[min(len(xs) - 1, math.ceil(0.95 * len(xs)) - 1)] if xs else 0.0

    def text(self) -> str:
        """One line for the printouts and the report."""
        if not self.modelled:
            return f"request path: not modelled (0 ms): {self.source}"
        when = f", {self.at}" if self.at else ""
        parts = []
        for route, name in (("colocated", "colocated"), ("disagg", "P/D")):
            n = len(self.samples(route))
            spread = f" (P95 {self.p95_ms(route):.1f}, {n} samples)" if n > 1 else ""
            parts.append(f"{name} mean {self.mean_ms(route):.1f} ms{spread}")
        s = self.time_scale
        scaled = (
            ""
            if s == 1
            else f", simulated ms at time scale {s:g}: the path's wall ms / {s:g} (wall means "
            f"{s * self.mean_ms('colocated'):.1f} / {s * self.mean_ms('disagg'):.1f} ms)"
        )
        return f"request path: {', '.join(parts)}{scaled}, added to each first token ({self.source}{when})"

    def doc(self) -> dict[str, Any]:
        """plan.json's `request_path` (`of_doc` reads it back)."""
        return {
            "modelled": self.modelled,
            "time_scale": self.time_scale,
            "source": self.source,
            "at": self.at,
            **{f"{r}_mean_ms": self.mean_ms(r) for r in ROUTES},
            **{f"{r}_p95_ms": self.p95_ms(r) for r in ROUTES},
            "colocated_ms": list(self.colocated_ms),
            "disagg_ms": list(self.disagg_ms),
        }


def of_doc(d: Mapping[str, Any]) -> RequestPath:
    """A plan.json's `request_path` as the path it was."""
    return RequestPath(
        tuple(float(x) for x in d["colocated_ms"]),
        tuple(float(x) for x in d["disagg_ms"]),
        str(d["source"]),
        d.get("at"),
        bool(d["modelled"]),
        float(d.get("time_scale", 1.0)),
    )


NOT_MODELLED = RequestPath(
    source="no measurement (--measure-path or --validate on a fleet) and no plan.request_path in the profile"
)


def of_profile(
    colocated_ms: float, disagg_ms: float, source: str, profile: str, time_scale: float = 1.0
) -> RequestPath:
    """The operator's figures (the profile's `plan.request_path`, wall ms), with the source they gave; on a
    simulator at `time_scale`, in the simulated ms the bench reports (wall / time_scale)."""
    s = time_scale
    where = f"profile {profile}'s plan.request_path: {source}"
    return RequestPath((colocated_ms / s,), (disagg_ms / s,), where, None, True, s)


@dataclass(frozen=True)
class RouteFigures:
    """One route's burst: the client's TTFTs (s, simulated time), the instances' own mean per role (ms)
    and how many first tokens each role counted in the window."""

    route: str
    client_s: tuple[float, ...]
    own_ms: Mapping[str, float]
    counted: Mapping[str, int]

    @property
    def client_ms(self) -> float:
        return 1000 * sum(self.client_s) / len(self.client_s) if self.client_s else math.nan

    @property
    def path_ms(self) -> float:
        """The mean path."""
        return self.client_ms - sum(self.own_ms.values())

    @property
    def samples_ms(self) -> tuple[float, ...]:
        """Each request's path: its client TTFT minus the instances' own mean (their spread is the path's:
        a minimal request's prefill is one step of the same size every time)."""
        own = sum(self.own_ms.values())
        return tuple(1000 * c - own for c in self.client_s)


def route_figures(route: str, client_s: Sequence[float], lab: Deltas) -> RouteFigures:
    """The burst of `route`: the client's TTFTs and, from the instances' /metrics deltas over the burst
    (pdfleet.plan.gaps.deltas), each role's own mean TTFT and count (NaN and 0 for a role with none)."""
    own, counted = {}, {}
    for role in ROLES[route]:
        h = lab.get((TTFT, route, role), {})
        n = h.get("count", 0.0)
        counted[role] = round(n)
        own[role] = 1000 * h.get("sum", 0.0) / n if n else math.nan
    return RouteFigures(route, tuple(client_s), own, counted)


def why_not(fig: RouteFigures) -> str | None:
    """Why a route's burst gives no path figure (None: it gives one)."""
    if not fig.client_s:
        return "no request of the burst succeeded"
    others = {role: n for role, n in fig.counted.items() if n != len(fig.client_s)}
    if others:
        counts = ", ".join(f"{role} {n}" for role, n in others.items())
        return (
            f"the instances counted other first tokens than the burst's {len(fig.client_s)} ({counts}): "
            "other traffic in the window, their own TTFT would mix it in"
        )
    if fig.path_ms < 0:
        return f"the client's mean TTFT ({fig.client_ms:.1f} ms) is under the instances' own: not a path"
    return None


def measured(
    figs: Sequence[RouteFigures], at: str, where: str, time_scale: float = 1.0
) -> tuple[RequestPath, list[str]]:
    """The path from the routes' bursts (`where`: the fleet and gateway measured; `time_scale`: its
    simulators', by which the client's TTFTs were divided); and a line per route with its figures, or why
    it gives none (that route's path is then 0, stated)."""
    lines: list[str] = []
    paths: dict[str, tuple[float, ...]] = {}
    for fig in figs:
        own = " + ".join(f"{role} {ms:.1f}" for role, ms in fig.own_ms.items())
        head = f"request path {fig.route}: client mean TTFT {fig.client_ms:.1f} ms, instances' own {own} ms"
        reason = why_not(fig)
        if reason is None:
            paths[fig.route] = fig.samples_ms
            p95 = RequestPath(fig.samples_ms).p95_ms("colocated")
            n = len(fig.client_s)
            lines.append(f"{head}: path mean {fig.path_ms:.1f} ms, P95 {p95:.1f} ms ({n} minimal requests)")
        else:
            lines.append(f"{head}: not measured, 0 ms: {reason}")
    if not paths:
        return RequestPath(
            source=f"measured on {where}, no route gave a figure", at=at, time_scale=time_scale
        ), lines
    missing = [r for r in ROUTES if r not in paths]
    source = f"measured on {where}" + (f" ({', '.join(missing)}: not measured, 0)" if missing else "")
    path = RequestPath(paths.get("colocated", ()), paths.get("disagg", ()), source, at, True, time_scale)
    return path, lines

"""What the gateway knows about one admitted request, built once by intake and read by the proxy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pdfleet.gateway.errors import Style as ErrorStyle
from pdfleet.gateway.keys import KeyEntry
from pdfleet.gateway.policy import ActivePolicy, Decision, LengthClass, Route

Endpoint = Literal["chat", "completions", "messages"]


@dataclass(slots=True)
class RequestContext:
    """One request after intake: who sent it, what it asks for, where it goes and since when.

    Built once by intake and only read after that. Not `frozen`: a frozen dataclass's __init__ costs
    ~10x more (about 5 us here, per request). `policy` is the policy object captured when the request
    arrived: a reload never changes it.
    """

    rid: str  # the X-Request-Id sent upstream and back to the client
    t0: float  # perf_counter() at arrival: TTFT and duration count from here
    policy: ActivePolicy
    key: KeyEntry
    endpoint: Endpoint
    alias: str  # the model alias the client asked for (metrics and logs name it)
    route: Route
    data: dict[str, Any]  # the parsed body
    body: bytes  # the bytes to forward: the client's own, re-encoded only for an upstream model rename
    stream: bool
    tokens: int  # estimated prompt tokens
    cls: LengthClass
    decision: Decision
    style: ErrorStyle = "openai"  # the shape of the gateway's own errors on this route
    model_slot: str | None = None  # the limiter's slot of this key on this alias (per_model limits)

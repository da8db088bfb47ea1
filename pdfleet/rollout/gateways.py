"""How the controller (and the operator's `invoke shadow`, `invoke keys.list`) talks to gateways: their
admin endpoints over HTTPS (verified against the gateway's CA) or, where the profile says `tls: off`, plain
HTTP, with a key: the controller's stage-only key (it reads the policy and sets the stage, nothing else) or,
on the operator's machine, the admin key.

`GET /admin/policy` says which version and stage a gateway runs; `POST /admin/stage` sets a new one (the
gateway rewrites its own policy file and reloads, no restart). Both may name a model: then the stage is
that model group's (`groups:` in the gateway's policy), every other model's left as it is. The key
travels only in the Authorization header; no error message here carries it.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pdfleet.errors import PdfleetError
from pdfleet.gateway.tls import client_context
from pdfleet.model.stages import StageSpec
from pdfleet.rollout.config import GatewayTarget


class GatewayError(PdfleetError):
    """A gateway did not answer, or refused the policy; the message names the gateway."""


class GatewayConflict(GatewayError):
    """The gateway runs a version at or above the one sent, with other content (409)."""


@dataclass(frozen=True)
class GatewayReport:
    """What one gateway runs."""

    name: str
    version: int
    stage: str
    weights: StageSpec


class GatewayClient:
    """The admin endpoints of every gateway host."""

    def __init__(self, key: str, timeout_s: float = 2.0, ca_file: str | None = None) -> None:
        self._auth = f"Bearer {key}"
        self.timeout_s = timeout_s
        # https admin URLs are verified against the gateway's CA (None: the system's trust store)
        self._tls = client_context(ca_file)

    def _call(self, target: GatewayTarget, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"{target.admin_url}{path}",
            data=data,
            method=method,
            headers={"Authorization": self._auth, "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s, context=self._tls) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as err:
            message = _error_message(err.read())
            kind = GatewayConflict if err.code == 409 else GatewayError
            raise kind(f"gateway {target.name}: {method} {path} answered {err.code}: {message}") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError, ValueError) as err:
            reason = getattr(err, "reason", err)
            raise GatewayError(
                f"gateway {target.name} ({target.admin_url}) is not answering: {reason}"
            ) from None

    def report(self, target: GatewayTarget, model: str | None = None) -> GatewayReport:
        """The version and stage a gateway runs now (of one model group when `model` is given)."""
        doc = self._call(target, "GET", "/admin/policy")
        try:
            if model is not None:
                groups = doc.get("groups") or {}
                if model not in groups:
                    raise GatewayError(
                        f"gateway {target.name}: its policy has no model group {model!r} "
                        f"(groups: {', '.join(groups) or 'none'})"
                    )
                staged = groups[model]
            else:
                staged = doc
            return GatewayReport(
                target.name,
                int(doc["version"]),
                str(staged["stage"]),
                StageSpec.model_validate(staged["stage_percent_disagg"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            raise GatewayError(
                f"gateway {target.name}: /admin/policy is not a pdfleet gateway's answer"
            ) from None

    def policy(self, target: GatewayTarget) -> dict[str, Any]:
        """A gateway's whole `GET /admin/policy` answer (stages, threshold, decider settings among it)."""
        doc = self._call(target, "GET", "/admin/policy")
        if not isinstance(doc, dict) or "stages" not in doc or "version" not in doc:
            raise GatewayError(f"gateway {target.name}: /admin/policy is not a pdfleet gateway's answer")
        return doc

    def apply(
        self,
        target: GatewayTarget,
        version: int,
        stage: str,
        stages: Mapping[str, StageSpec],
        model: str | None = None,
    ) -> None:
        """Make a gateway run `stage` as `version` (a no-op when it already does); with `model`, as that
        model group's stage."""
        body: dict[str, Any] = {
            "version": version,
            "stage": stage,
            "stages": {k: v.model_dump() for k, v in stages.items()},
        }
        if model is not None:
            body["model"] = model
        self._call(target, "POST", "/admin/stage", body)

    def shadow(self, target: GatewayTarget, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """A gateway's shadow run (issue 33): start or stop one (`body`: `POST /admin/shadow`), or read it
        (None: `GET`); the gateway's status document either way."""
        doc = self._call(target, "GET" if body is None else "POST", "/admin/shadow", body)
        if not isinstance(doc, dict) or "running" not in doc:
            raise GatewayError(f"gateway {target.name}: /admin/shadow is not a pdfleet gateway's answer")
        return doc

    def keys(self, target: GatewayTarget) -> list[dict[str, Any]]:
        """The keys a gateway accepts (`GET /admin/keys`, admin key only): names, scopes, dates, last use."""
        doc = self._call(target, "GET", "/admin/keys")
        if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
            raise GatewayError(f"gateway {target.name}: /admin/keys is not a pdfleet gateway's answer")
        return [k for k in doc["keys"] if isinstance(k, dict)]


def _error_message(raw: bytes) -> str:
    """The message of an OpenAI-shaped error body (bounded), or a placeholder."""
    try:
        return str(json.loads(raw)["error"]["message"])[:500]
    except (ValueError, KeyError, TypeError):
        return "(no error message)"

"""The profile's `monitoring.alertmanager:` section: Alertmanager on the monitoring group, where its
notifications go (receivers), which alerts go where (routes by severity and pool), and its timings.

A receiver's secrets (a Slack webhook URL, an SMTP password, a webhook's bearer token) are never in the
profile: it names where the control machine reads each one (`{file: PATH}`, mode 0600, or `{env: NAME}`),
as `model.token` does; provision writes them to 0600 files on the monitoring host that Alertmanager reads
(`*_file` settings), so they are in no rendered config, argv, unit or log.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from pdfleet.model.specs import StrictModel, TokenSource

Port = Annotated[int, Field(ge=1, le=65535)]
RECEIVER_NAME = r"^[a-z][a-z0-9-]{0,30}$"
LAB_RECEIVER = "lab-recorder"  # the lab's recording receiver's name in alertmanager.yml (not a profile name)
_HOST_PORT = re.compile(r"^[A-Za-z0-9.\-]+:[0-9]{1,5}$")
_ADDRESS = re.compile(r"^[^@\s]+@[^@\s]+$")


def _secret_source(value: object) -> object:
    """A secret written into the profile itself is refused without echoing it (a profile is committed and
    printed, and errors are shown): name its file or variable instead."""
    if isinstance(value, str):
        raise ValueError(
            "is a secret: name where the control machine reads it, {file: PATH} (mode 0600) or {env: NAME}, "
            "never the value itself"
        )
    return value


def _http_url(value: str) -> str:
    if not value.startswith(("http://", "https://")) or any(c.isspace() for c in value):
        raise ValueError(f"must be an http:// or https:// URL without spaces (got {value!r})")
    return value


class WebhookReceiver(StrictModel):
    """Alertmanager's webhook: the JSON of every notification POSTed to `url`."""

    url: str
    bearer_token: TokenSource | None = None  # sent as `Authorization: Bearer ...` (read from a 0600 file)

    _token = field_validator("bearer_token", mode="before")(_secret_source)

    @model_validator(mode="after")
    def _url(self) -> WebhookReceiver:
        _http_url(self.url)
        return self


class EmailReceiver(StrictModel):
    """E-mail through the site's SMTP relay."""

    to: str
    sender: str  # the From address
    smarthost: str  # HOST:PORT of the relay
    username: str | None = Field(default=None, min_length=1)
    password: TokenSource | None = None
    require_tls: bool = True

    _password = field_validator("password", mode="before")(_secret_source)

    @model_validator(mode="after")
    def _addresses(self) -> EmailReceiver:
        for key, value in (("to", self.to), ("sender", self.sender)):
            if not _ADDRESS.match(value):
                raise ValueError(f"{key}: {value!r} is not an e-mail address")
        if not _HOST_PORT.match(self.smarthost):
            raise ValueError(f"smarthost: {self.smarthost!r} is not HOST:PORT (e.g. smtp.example.org:587)")
        if (self.username is None) != (self.password is None):
            raise ValueError("set both username and password (SMTP AUTH), or neither")
        return self


class SlackReceiver(StrictModel):
    """Slack's incoming webhook: its URL is the secret."""

    api_url: TokenSource
    channel: str = Field(pattern=r"^[#@][^\s]{1,80}$")

    _url = field_validator("api_url", mode="before")(_secret_source)


class Receiver(StrictModel):
    """Where notifications go: any of a webhook, an e-mail address and a Slack channel."""

    name: str = Field(pattern=RECEIVER_NAME)
    webhook: WebhookReceiver | None = None
    email: EmailReceiver | None = None
    slack: SlackReceiver | None = None

    @model_validator(mode="after")
    def _something(self) -> Receiver:
        if self.webhook is None and self.email is None and self.slack is None:
            raise ValueError(f"receiver {self.name}: set at least one of webhook, email or slack")
        return self


class AlertRoute(StrictModel):
    """The alerts of a severity and/or pool go to a receiver (the first route that matches wins)."""

    receiver: str
    severity: Literal["critical", "warning"] | None = None
    pool: Literal["colocated", "disagg"] | None = None

    @model_validator(mode="after")
    def _matches(self) -> AlertRoute:
        if self.severity is None and self.pool is None:
            raise ValueError(
                f"route to {self.receiver}: set severity, pool or both (else use default_receiver)"
            )
        return self


class AlertmanagerSpec(StrictModel):
    """Alertmanager on the monitoring group: its port, receivers, routes and timings."""

    port: Port = 9093
    receivers: list[Receiver] = Field(default_factory=list)
    routes: list[AlertRoute] = Field(default_factory=list)
    default_receiver: str | None = None  # unset: the first receiver (none: notifications go nowhere)
    group_wait_s: int = Field(default=30, ge=0, le=3600)
    group_interval_s: int = Field(default=300, ge=1, le=86_400)
    repeat_interval_s: int = Field(default=4 * 3600, ge=1, le=30 * 86_400)
    # the lab's recorder: a receiver on the monitoring host keeping every notification for tests to read
    lab_receiver: bool = False
    lab_receiver_port: Port = 9097

    @model_validator(mode="after")
    def _names(self) -> AlertmanagerSpec:
        names = [r.name for r in self.receivers]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"receivers: {', '.join(twice)} named twice")
        if LAB_RECEIVER in names:
            raise ValueError(f"receivers: {LAB_RECEIVER} is the lab recorder's name; choose another")
        known = ", ".join(names) or "none"
        for n, route in enumerate(self.routes):
            if route.receiver not in names:
                raise ValueError(f"routes[{n}].receiver: no receiver {route.receiver!r} (receivers: {known})")
        if self.default_receiver is not None and self.default_receiver not in names:
            raise ValueError(f"default_receiver: no receiver {self.default_receiver!r} (receivers: {known})")
        return self

    @property
    def default(self) -> str | None:
        """The receiver of every alert no route takes: default_receiver, else the first receiver."""
        return self.default_receiver or (self.receivers[0].name if self.receivers else None)

    def secrets(self) -> list[tuple[str, TokenSource]]:
        """(name, source) of every secret the receivers name: `<receiver>-slack-url`, `-smtp-password`,
        `-webhook-token`, the names of their files on the monitoring host."""
        out = []
        for r in self.receivers:
            if r.slack is not None:
                out.append((f"{r.name}-slack-url", r.slack.api_url))
            if r.email is not None and r.email.password is not None:
                out.append((f"{r.name}-smtp-password", r.email.password))
            if r.webhook is not None and r.webhook.bearer_token is not None:
                out.append((f"{r.name}-webhook-token", r.webhook.bearer_token))
        return out

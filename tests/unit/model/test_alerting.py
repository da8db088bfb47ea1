"""The profile's monitoring.alertmanager section: a bad receiver or route is one clear error naming the
key, and a secret written into the profile is refused without being echoed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pdfleet.errors import PdfleetError
from pdfleet.model.profile_loader import load_profile
from tests.unit.fleet.helpers import REPO

SLACK_URL = "https://hooks.slack.com/services/T000/B000/XXXXXXXXXXXXXXXX"


def _load(tmp_path: Path, alertmanager: str) -> object:
    profiles = tmp_path / "profiles"
    if not profiles.exists():
        shutil.copytree(REPO / "profiles", profiles)
    (profiles / "t.yml").write_text(f"extends: lab-cross\nmonitoring:\n  alertmanager:\n{alertmanager}")
    return load_profile("t", profiles)


BAD = {
    "a route to an unknown receiver": (
        "    receivers: [{name: ops, webhook: {url: 'https://example.org/hook'}}]\n"
        "    routes: [{receiver: pager, severity: critical}]\n",
        "routes[0].receiver: no receiver 'pager' (receivers: ops)",
    ),
    "two receivers of one name": (
        "    receivers:\n"
        "      - {name: ops, webhook: {url: 'https://example.org/a'}}\n"
        "      - {name: ops, webhook: {url: 'https://example.org/b'}}\n",
        "receivers: ops named twice",
    ),
    "a receiver that sends nowhere": (
        "    receivers: [{name: ops}]\n",
        "receiver ops: set at least one of webhook, email or slack",
    ),
    "a webhook that is no URL": (
        "    receivers: [{name: ops, webhook: {url: 'example.org/hook'}}]\n",
        "must be an http:// or https:// URL",
    ),
    "an e-mail without an address": (
        "    receivers: [{name: ops, email: {to: ops, sender: 'am@example.org', smarthost: 'smtp:587'}}]\n",
        "to: 'ops' is not an e-mail address",
    ),
    "a smarthost without a port": (
        "    receivers: [{name: ops, email: {to: 'a@b.c', sender: 'am@b.c', smarthost: smtp}}]\n",
        "smarthost: 'smtp' is not HOST:PORT",
    ),
    "a route matching everything": (
        "    receivers: [{name: ops, webhook: {url: 'https://example.org/hook'}}]\n"
        "    routes: [{receiver: ops}]\n",
        "set severity, pool or both",
    ),
    "an unknown severity": (
        "    receivers: [{name: ops, webhook: {url: 'https://example.org/hook'}}]\n"
        "    routes: [{receiver: ops, severity: page}]\n",
        "monitoring.alertmanager.routes[0].severity",
    ),
    "the lab recorder's name": (
        "    receivers: [{name: lab-recorder, webhook: {url: 'https://example.org/hook'}}]\n",
        "lab-recorder is the lab recorder's name",
    ),
    "a default receiver that does not exist": (
        "    receivers: [{name: ops, webhook: {url: 'https://example.org/hook'}}]\n"
        "    default_receiver: pager\n",
        "default_receiver: no receiver 'pager'",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_receiver_or_route_is_one_clear_error(case: str, tmp_path: Path) -> None:
    text, expected = BAD[case]
    with pytest.raises(PdfleetError) as raised:
        _load(tmp_path, text)
    assert expected in str(raised.value), str(raised.value)
    assert "monitoring.alertmanager" in str(raised.value)


@pytest.mark.parametrize(
    "receiver",
    [
        f"{{name: ops, slack: {{api_url: '{SLACK_URL}', channel: '#ops'}}}}",
        "{name: ops, email: {to: a@b.c, sender: am@b.c, smarthost: 'smtp:587', username: am, "
        f"password: '{SLACK_URL}'}}}}",
        f"{{name: ops, webhook: {{url: 'https://example.org/hook', bearer_token: '{SLACK_URL}'}}}}",
    ],
)
def test_a_secret_written_into_the_profile_is_refused_and_not_echoed(receiver: str, tmp_path: Path) -> None:
    with pytest.raises(PdfleetError) as raised:
        _load(tmp_path, f"    receivers: [{receiver}]\n")
    assert "is a secret" in str(raised.value) and "{file: PATH}" in str(raised.value)
    assert SLACK_URL not in str(raised.value)


def test_receivers_routes_and_the_default() -> None:
    from pdfleet.model.alerting import AlertmanagerSpec

    spec = AlertmanagerSpec.model_validate(
        {
            "receivers": [
                {"name": "ops", "webhook": {"url": "https://example.org/hook", "bearer_token": {"env": "T"}}},
                {"name": "pager", "slack": {"api_url": {"file": "/etc/s"}, "channel": "#pager"}},
            ],
            "routes": [{"receiver": "pager", "severity": "critical", "pool": "disagg"}],
        }
    )
    assert spec.default == "ops"  # the first receiver, unless default_receiver says otherwise
    assert [name for name, _ in spec.secrets()] == ["ops-webhook-token", "pager-slack-url"]
    assert AlertmanagerSpec().default is None and AlertmanagerSpec().secrets() == []

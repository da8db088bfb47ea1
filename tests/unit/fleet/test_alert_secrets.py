"""The receivers' secrets: read on the control machine from an owner-only file or a variable, refused
naming the key and the file or variable (never the value), and asked for only when the monitoring role
runs on a monitoring host."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pdfleet.errors import ValidationError
from pdfleet.fleet.alert_secrets import read_alert_secrets
from pdfleet.fleet.deployment import DeploymentRequest, load_deployment
from pdfleet.model.alerting import AlertmanagerSpec
from roles import REGISTRY
from tests.unit.fleet.helpers import REPO

SECRET = "https://hooks.slack.com/services/T000/B000/SECRETSECRET"


def _spec(source: dict[str, str]) -> AlertmanagerSpec:
    return AlertmanagerSpec.model_validate(
        {"receivers": [{"name": "pager", "slack": {"api_url": source, "channel": "#pager"}}]}
    )


def test_from_an_owner_only_file_or_a_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "slack.url"
    file.write_text(SECRET + "\n")
    file.chmod(0o600)
    assert read_alert_secrets(_spec({"file": str(file)})) == {"pager-slack-url": SECRET}
    monkeypatch.setenv("SLACK_URL", SECRET)
    assert read_alert_secrets(_spec({"env": "SLACK_URL"})) == {"pager-slack-url": SECRET}


def test_refusals_name_the_key_and_the_file_never_the_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "monitoring.alertmanager.receivers[0].slack.api_url"
    file = tmp_path / "slack.url"
    with pytest.raises(ValidationError, match=re.escape(f"{key}.file: {file} does not exist")):
        read_alert_secrets(_spec({"file": str(file)}))
    file.write_text(SECRET)
    file.chmod(0o644)
    with pytest.raises(ValidationError, match="owner only"):
        read_alert_secrets(_spec({"file": str(file)}))
    file.chmod(0o600)
    file.write_text(SECRET + " two words")
    with pytest.raises(ValidationError) as raised:
        read_alert_secrets(_spec({"file": str(file)}))
    assert "not one secret" in str(raised.value) and SECRET not in str(raised.value)
    monkeypatch.delenv("SLACK_URL", raising=False)
    with pytest.raises(
        ValidationError, match=re.escape(f"{key}.env: the environment variable SLACK_URL is unset")
    ):
        read_alert_secrets(_spec({"env": "SLACK_URL"}))


def test_asked_only_when_the_monitoring_role_runs_on_a_monitoring_host() -> None:
    asked: list[AlertmanagerSpec] = []

    def secrets(spec: AlertmanagerSpec) -> dict[str, str]:
        asked.append(spec)
        return {}

    def load(limit: str | None, roles: tuple[str, ...]) -> None:
        chosen = tuple(r for r in REGISTRY if r.NAME in roles)
        request = DeploymentRequest(
            "lab-cross",
            REPO / "inventory/lab.yml",
            REPO / "profiles",
            REPO / "templates",
            chosen,
            limit=limit,
            alert_secrets=secrets,
        )
        load_deployment(request)

    load("lab-d1", ("monitoring",))
    load("lab-gw", ("services",))
    assert not asked
    load("lab-gw", ("monitoring",))
    assert len(asked) == 1

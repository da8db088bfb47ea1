"""monitoring's Alertmanager half: a changed config is checked with amtool then reloaded, the receivers'
secrets go only into 0600 files Alertmanager's user owns (never into a rendered file), and the lab's
recorder is installed only where the profile asks for it."""

from __future__ import annotations

from typing import Any

from pdfleet.fleet.roles import RoleContext
from pdfleet.model.alerting import AlertmanagerSpec
from pdfleet.monitoring.alertmanager_config import AM_CONFIG_FILE, AM_SECRETS_DIR, secret_file
from pdfleet.ops.apt import AptPackages
from pdfleet.ops.base import FakeFacts, Run
from pdfleet.ops.files import Directory, File
from pdfleet.ops.systemd import Service
from roles.monitoring import alerting
from tests.unit.roles.helpers import deployment

SLACK = "https://hooks.slack.com/services/T000/B000/SECRETSECRET"
RECEIVERS: dict[str, Any] = {
    "receivers": [
        {"name": "pager", "slack": {"api_url": {"env": "SLACK_URL"}, "channel": "#pager"}},
        {
            "name": "mail",
            "email": {
                "to": "oncall@example.org",
                "sender": "am@example.org",
                "smarthost": "smtp.example.org:587",
                "username": "am",
                "password": {"env": "SMTP_PASSWORD"},
            },
        },
    ]
}


def _ctx(profile: str = "lab-cross", secrets: dict[str, str] | None = None, **am: Any) -> RoleContext:
    fleet = deployment(profile)
    ctx = fleet.context(fleet.inventory.hosts["lab-gw"])
    if not am:
        return ctx
    spec = AlertmanagerSpec.model_validate({**ctx.profile.monitoring.alertmanager.model_dump(), **am})
    mon = ctx.profile.monitoring.model_copy(update={"alertmanager": spec})
    profile_with = ctx.profile.model_copy(update={"monitoring": mon})
    return RoleContext(
        ctx.host, profile_with, ctx.topology, ctx.renderer, ctx.host_version, alert_secrets=secrets or {}
    )


def test_a_changed_config_is_checked_with_amtool_then_reloaded() -> None:
    restart, reload = alerting.handlers(_ctx())
    assert [c.cmd for c in reload.commands if isinstance(c, Run)] == [
        f"amtool check-config {AM_CONFIG_FILE}",
        "systemctl reload prometheus-alertmanager.service",
    ]
    assert [c.cmd for c in restart.commands if isinstance(c, Run)][
        0
    ] == f"amtool check-config {AM_CONFIG_FILE}"


def test_secrets_go_only_into_0600_files_of_alertmanager_s_user() -> None:
    secrets = {"pager-slack-url": SLACK, "mail-smtp-password": "hunter2-SECRETSECRET"}
    ctx = _ctx(secrets=secrets, **RECEIVERS)
    ops = list(alerting.service_operations(ctx))
    written = {op.path: op for op in ops if isinstance(op, File) and op.path.startswith(AM_SECRETS_DIR)}
    assert set(written) == {secret_file("pager-slack-url"), secret_file("mail-smtp-password")}
    for op in written.values():
        assert (op.mode, op.owner, op.group, op.secret) == ("0600", "prometheus", "prometheus", True)
    assert written[secret_file("pager-slack-url")].content == (SLACK + "\n").encode()
    (folder,) = [op for op in ops if isinstance(op, Directory) and op.path == AM_SECRETS_DIR]
    assert (folder.mode, folder.owner) == ("0700", "prometheus")
    rendered = "".join(f.content for f in alerting.files(ctx))  # what `invoke render` writes
    assert "SECRETSECRET" not in rendered and "hunter2" not in rendered
    assert "SECRETSECRET" not in repr(ctx)


def test_the_recorder_only_where_the_profile_asks() -> None:
    lab = _ctx()
    names = {u.unit for u in alerting.units(lab)}
    assert names == {alerting.UNIT, alerting.RECORDER_UNIT}
    assert any(
        isinstance(op, Service) and op.unit == alerting.RECORDER_UNIT
        for op in alerting.service_operations(lab)
    )
    plain = _ctx("lab-colocated")
    assert {u.unit for u in alerting.units(plain)} == {alerting.UNIT}
    assert not alerting.recorder_files(plain)


def test_alertmanager_s_files_come_before_its_package() -> None:
    from roles import monitoring

    ctx = _ctx()
    ops = list(monitoring.operations(ctx, FakeFacts({AptPackages(): {"prometheus": "2.42"}})))
    paths = [getattr(op, "path", None) or getattr(op, "name", None) for op in ops]
    assert paths.index(AM_CONFIG_FILE) < paths.index(alerting.PACKAGE)

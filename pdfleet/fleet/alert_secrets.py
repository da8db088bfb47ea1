"""The Alertmanager receivers' secrets (a Slack webhook URL, an SMTP password, a webhook's bearer token),
read on the control machine from where the profile says (`{file: PATH}`, owner-only like the gateway's
keys, or `{env: NAME}`), only when the monitoring role runs on a monitoring host. The values go into the
monitoring role's 0600 files on that host and nowhere else; errors name the key and file or variable,
never a value."""

from __future__ import annotations

import os
import re
from pathlib import Path

from pdfleet.errors import ValidationError
from pdfleet.fleet.secrets import existing_key
from pdfleet.model.alerting import AlertmanagerSpec
from pdfleet.model.specs import TokenSource

ONE_LINE = re.compile(r"^[\x21-\x7e]+$")  # visible ASCII: one line in the file Alertmanager reads


def read_secret(where: str, source: TokenSource) -> str:
    """One secret's value from its file or variable; `where` names it in errors (the profile's key)."""
    if source.env is not None:
        value = os.environ.get(source.env, "").strip()
        what = f"{where}.env: the environment variable {source.env}"
        if not value:
            raise ValidationError(f"{what} is unset or empty")
    else:
        assert source.file is not None
        file = Path(source.file).expanduser()
        what = f"{where}.file: {file}"
        kept = existing_key(file)
        if kept is None:
            raise ValidationError(f"{what} does not exist (put the secret there, mode 0600)")
        value = kept
    if not ONE_LINE.fullmatch(value):
        raise ValidationError(f"{what} holds a space, line break or non-ASCII character: not one secret")
    return value


def read_alert_secrets(spec: AlertmanagerSpec) -> dict[str, str]:
    """Every secret the receivers name, by its name (AlertmanagerSpec.secrets)."""
    keys = {
        "slack-url": "slack.api_url",
        "smtp-password": "email.password",
        "webhook-token": "webhook.bearer_token",
    }
    out = {}
    for name, source in spec.secrets():
        receiver, kind = next((name[: -len(k) - 1], k) for k in keys if name.endswith("-" + k))
        index = [r.name for r in spec.receivers].index(receiver)
        out[name] = read_secret(f"monitoring.alertmanager.receivers[{index}].{keys[kind]}", source)
    return out

"""Alertmanager's configuration for a deployment: the profile's receivers and routes, the lab's recorder,
and the inhibition of a pool's other alerts while the pool is down.

Routes: the lab's recorder first when the profile has one (every alert, `continue: true`), then the
profile's routes in order (severity and/or pool), the rest to the default receiver (a last route of its
own beside the recorder's: a matched child route keeps an alert from the root's receiver). Alerts are
grouped by alertname, model, pool and role. While `PdfleetPoolDown` fires for a pool, every other alert
of that pool (a down target, a latency over its SLO...) is inhibited: one page says what is wrong.
Secrets are read by Alertmanager from 0600 files (`*_file`); the config names the files, never a secret.
Written with a YAML dumper from data, as prometheus.yml is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pdfleet.errors import ValidationError
from pdfleet.fleet.topology import Alertmanager
from pdfleet.model.alerting import LAB_RECEIVER, AlertRoute, Receiver
from pdfleet.model.profile import Profile
from pdfleet.monitoring.monitoring_config import CONFIG_DIR, dump

AM_CONFIG_FILE = f"{CONFIG_DIR}/alertmanager.yml"  # where Debian's package reads it
AM_DEFAULTS_FILE = "/etc/default/prometheus-alertmanager"  # Debian's unit reads ARGS from here
AM_SECRETS_DIR = f"{CONFIG_DIR}/alertmanager-secrets"  # 0700 prometheus: the receivers' secrets, 0600
AM_STORAGE_DIR = "/var/lib/prometheus/alertmanager/"  # the Debian package's
AM_USER = "prometheus"  # Debian's unit runs Alertmanager as this user
POOL_DOWN = "PdfleetPoolDown"  # the alert that inhibits its pool's others (pdfleet.monitoring.alerts)
NOWHERE = "nowhere"  # the receiver of a profile that names none: notifications are dropped
GROUP_BY = ["alertname", "model", "pool", "role"]
RECORDER_PATH = "/alerts"  # where the lab's recorder takes Alertmanager's webhook POSTs


def secret_file(name: str) -> str:
    """The file on the monitoring host holding one of the receivers' secrets (AlertmanagerSpec.secrets)."""
    return f"{AM_SECRETS_DIR}/{name}"


def _receiver(r: Receiver) -> dict[str, Any]:
    out: dict[str, Any] = {"name": r.name}
    if r.webhook is not None:
        hook: dict[str, Any] = {"url": r.webhook.url, "send_resolved": True}
        if r.webhook.bearer_token is not None:
            token = secret_file(f"{r.name}-webhook-token")
            hook["http_config"] = {"authorization": {"type": "Bearer", "credentials_file": token}}
        out["webhook_configs"] = [hook]
    if r.email is not None:
        mail: dict[str, Any] = {
            "to": r.email.to,
            "from": r.email.sender,
            "smarthost": r.email.smarthost,
            "require_tls": r.email.require_tls,
            "send_resolved": True,
        }
        if r.email.username is not None:
            mail["auth_username"] = r.email.username
            mail["auth_password_file"] = secret_file(f"{r.name}-smtp-password")
        out["email_configs"] = [mail]
    if r.slack is not None:
        out["slack_configs"] = [
            {
                "api_url_file": secret_file(f"{r.name}-slack-url"),
                "channel": r.slack.channel,
                "send_resolved": True,
            }
        ]
    return out


def _route(route: AlertRoute) -> dict[str, Any]:
    matchers = [
        f'{key}="{value}"' for key, value in (("severity", route.severity), ("pool", route.pool)) if value
    ]
    return {"receiver": route.receiver, "matchers": matchers}


def inhibit_rules(profile: Profile) -> list[dict[str, Any]]:
    """A pool's other alerts are inhibited while it is down; in a `models:` profile, the same model's only
    (a single-model profile's gateway labels its series with the alias, not the model's name)."""
    equal = ["model", "pool"] if profile.models else ["pool"]
    return [
        {
            "source_matchers": [f'alertname="{POOL_DOWN}"'],
            "target_matchers": [f'alertname!="{POOL_DOWN}"'],
            "equal": equal,
        }
    ]


def alertmanager_config(profile: Profile, am: Alertmanager) -> str:
    """alertmanager.yml for a monitoring host's Alertmanager (see the module docstring)."""
    spec = profile.monitoring.alertmanager
    receivers = [_receiver(r) for r in spec.receivers]
    routes = [_route(r) for r in spec.routes]
    if am.recorder_url is not None:
        hook = {"url": am.recorder_url + RECORDER_PATH, "send_resolved": True}
        receivers.append({"name": LAB_RECEIVER, "webhook_configs": [hook]})
        routes.insert(0, {"receiver": LAB_RECEIVER, "continue": True})
    default = spec.default
    if default is None:
        default = NOWHERE
        receivers.append({"name": NOWHERE})
    if am.recorder_url is not None:  # the recorder's route matched: the root's receiver would be skipped
        routes.append({"receiver": default})
    doc: dict[str, Any] = {
        "route": {
            "receiver": default,
            "group_by": GROUP_BY,
            "group_wait": f"{spec.group_wait_s}s",
            "group_interval": f"{spec.group_interval_s}s",
            "repeat_interval": f"{spec.repeat_interval_s}s",
            "routes": routes,
        },
        "inhibit_rules": inhibit_rules(profile),
        "receivers": receivers,
    }
    return "# Managed by pdfleet (roles/monitoring); checked with amtool before every reload.\n" + dump(doc)


def listen_address(am: Alertmanager) -> str:
    """HOST:PORT an Alertmanager listens on (the topology's address and port)."""
    return f"{am.address}:{am.port}"


def alertmanager_args(am: Alertmanager) -> list[str]:
    """The daemon's flags: one Alertmanager per monitoring host, not a cluster (no gossip port)."""
    return [
        f"--config.file={AM_CONFIG_FILE}",
        f"--storage.path={AM_STORAGE_DIR}",
        f"--web.listen-address={listen_address(am)}",
        f"--web.external-url={am.url}",
        "--cluster.listen-address=",
    ]


def alertmanager_defaults(am: Alertmanager) -> str:
    """/etc/default/prometheus-alertmanager: ARGS only (built from an address and a validated port)."""
    args = " ".join(alertmanager_args(am))
    if any(c in args for c in '"$\\`\n\r'):
        raise ValidationError(
            f"inventory: host {am.host}: address {am.address!r} cannot be written into {AM_DEFAULTS_FILE}"
        )
    return f'# Managed by pdfleet (roles/monitoring).\nARGS="{args}"\n'


def secret_files(profile: Profile, values: Mapping[str, str]) -> list[tuple[str, str]]:
    """(path, content) of every secret file the receivers read, from the values the control machine read
    (by name: AlertmanagerSpec.secrets); a secret not read is refused, naming it (never its value)."""
    out = []
    for name, _ in profile.monitoring.alertmanager.secrets():
        if name not in values:
            raise ValidationError(
                f"monitoring.alertmanager: the secret {name} was not read on the control machine"
            )
        out.append((secret_file(name), values[name] + "\n"))
    return out

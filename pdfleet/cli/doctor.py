"""`invoke doctor`: the client view (`--base-url URL --api-key-env VAR [--anthropic]`) or the fleet and
metrics view (`--profile P`); a table of findings or `--json`, exit 1 when any finding is an error.

Thin wiring: every input is checked before anything is sent; the probes, gatherers and rules live in
pdfleet.doctor.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from invoke import Context, task
from invoke.exceptions import Exit

from pdfleet.cli.exits import user_errors
from pdfleet.cli.monitor import number
from pdfleet.cli.options import HELP as COMMON_HELP
from pdfleet.cli.settings import repo_path
from pdfleet.errors import ConnectError, ValidationError

if TYPE_CHECKING:  # imported when a task runs (pdfleet/cli/__init__.py)
    from pdfleet.doctor.finding import Finding
    from pdfleet.doctor.probe import ScriptCall

MAX_BODY_BYTES = 1 << 20
DEFAULT_WINDOW_MIN = 10.0
DEFAULT_SAMPLE_S = 15.0

HELP = {
    "profile": "Fleet and metrics view: " + COMMON_HELP["profile"],
    "inventory": COMMON_HELP["inventory"],
    "base_url": "Client view: the base URL a script gives its SDK (OpenAI: http://GATEWAY:8080/v1; "
    "Anthropic: http://GATEWAY:8080; default with --anthropic: $ANTHROPIC_BASE_URL).",
    "api_key_env": "Client view: the environment variable holding the key (its value is never printed; "
    "default with --anthropic: ANTHROPIC_API_KEY, else ANTHROPIC_AUTH_TOKEN).",
    "anthropic": "Client view: probe as the Anthropic SDK does (/v1/messages); check ANTHROPIC_* variables.",
    "model": "Client view: the model alias the script asks for (default: the first one the base URL lists).",
    "endpoint": "Client view, with --body: the path the script posts to, relative to the base URL "
    "(chat/completions or completions).",
    "body": "Client view: a JSON file with the request body the script sends (checked against --endpoint).",
    "stream": "Client view, with --body: the script reads the answer as a stream.",
    "minutes": f"Fleet view: the metrics window in minutes (default {DEFAULT_WINDOW_MIN:g}; at least 1).",
    "sample": f"Fleet view without Prometheus: seconds between the two direct scrapes (default "
    f"{DEFAULT_SAMPLE_S:g}; at least 1).",
    "kv_path": "Fleet view: also run verify's KV-path probe (the connector's library moves 64 MiB between "
    "each prefill/decode pair's own processes, ~6 s a pair; off by default for that time) and report each "
    "pair's throughput, or the stage that failed with the fix (kv.path).",
    "json": "Print the findings as JSON instead of a table.",
    "timeout": "Seconds to wait for each answer (default 10).",
}


@task(help=HELP)
@user_errors
def doctor(
    ctx: Context,
    profile: str | None = None,
    inventory: str | None = None,
    base_url: str | None = None,
    api_key_env: str | None = None,
    anthropic: bool = False,
    model: str | None = None,
    endpoint: str | None = None,
    body: str | None = None,
    stream: bool = False,
    minutes: str = str(DEFAULT_WINDOW_MIN),
    sample: str = str(DEFAULT_SAMPLE_S),
    json: bool = False,
    timeout: str = "10",
    kv_path: bool = False,
) -> None:
    """Diagnose a client's setup (401s, wrong base URL or endpoint) or a fleet (KV transfer, tuning)."""
    wait = number("--timeout", timeout, most=3600.0)
    if wait <= 0:
        raise ValidationError(f"--timeout: {timeout} must be more than 0 seconds")
    client_opts = base_url or api_key_env or anthropic or model or endpoint or body or stream
    if profile is not None and client_opts:
        raise ValidationError(
            "--profile (the fleet view) and --base-url/--api-key-env/--anthropic (the client "
            "view) are separate runs: give one or the other"
        )
    if kv_path and profile is None:
        raise ValidationError("--kv-path is part of the fleet view: give --profile P")
    if profile is not None:
        from pdfleet.cli.doctor_fleet import fleet_findings

        window = number("--minutes", minutes)
        if window < 1:
            raise ValidationError(f"--minutes: {minutes} is less than 1")
        every = number("--sample", sample)
        if every < 1:
            raise ValidationError(f"--sample: {sample} is less than 1 second")
        findings, target = fleet_findings(ctx, profile, inventory, window * 60, every, wait, kv_path)
        _finish(findings, "fleet", target, json)
        return
    findings, target = _client(base_url, api_key_env, anthropic, model, endpoint, body, stream, wait)
    _finish(findings, "client", target, json)


def _finish(findings: list[Finding], view: str, target: str, as_json: bool) -> None:
    """Print the table or the JSON; exit 1 when a finding is an error."""
    from pdfleet.doctor.finding import has_error
    from pdfleet.doctor.report import format_table, to_json

    if as_json:
        print(to_json(findings, view, target))
    else:
        print(format_table(findings, f"pdfleet doctor — {view} view — {target}"), end="")
    if has_error(findings):
        raise Exit(code=1)


def _client(
    base_url: str | None,
    api_key_env: str | None,
    anthropic: bool,
    model: str | None,
    endpoint: str | None,
    body: str | None,
    stream: bool,
    timeout: float,
) -> tuple[list[Finding], str]:
    """Check the client options, then probe and diagnose."""
    from pdfleet.doctor.client import check_client
    from pdfleet.lab.network import lab_route_problem

    environ = dict(os.environ)
    url = base_url or (environ.get("ANTHROPIC_BASE_URL") if anthropic else None)
    if not url:
        raise ValidationError(
            "give --base-url URL (the base URL the client uses), or --profile P for the fleet "
            "view" + ("; ANTHROPIC_BASE_URL is unset too" if anthropic else "")
        )
    check_url(url)
    var, key = client_key(api_key_env, anthropic, environ)
    script = script_call(endpoint, body, stream) if (endpoint or body or stream) else None
    if script is not None and anthropic:
        raise ValidationError("--body/--endpoint/--stream check an OpenAI-API script; leave out --anthropic")
    problem = lab_route_problem([urlsplit(url).hostname or ""])
    if problem:
        raise ConnectError(problem)
    _facts, findings = check_client(url, key, var, anthropic, environ, model, script, timeout)
    return findings, url


def shown_url(url: str) -> str:
    """The URL as an error may show it: a user name and password before the host become `***`."""
    scheme, sep, rest = url.partition("//")
    authority = rest.split("/", 1)[0]
    if not sep or "@" not in authority:
        return url
    return f"{scheme}//***@{rest[len(authority.rsplit('@', 1)[0]) + 1 :]}"


def check_url(url: str) -> None:
    """An http(s) URL with a host and, if any, a numeric port, and no password in it (else a
    ValidationError naming it, the user name and password masked)."""
    shown = shown_url(url)
    if shown != url:  # it was printed in the report's title and findings, and sent as Basic auth
        raise ValidationError(
            f"--base-url {shown!r}: carries a user name or password (masked here); a pdfleet gateway "
            "takes its key in the Authorization header: drop it from the URL and give --api-key-env VAR"
        )
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ValidationError(f"--base-url {url!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValidationError(
            f"--base-url {url!r}: not an http:// or https:// URL with a host "
            "(e.g. http://198.18.0.10:8080/v1)"
        )
    if port == 0:
        raise ValidationError(f"--base-url {url!r}: port 0 is not a port to connect to")


def client_key(api_key_env: str | None, anthropic: bool, environ: dict[str, str]) -> tuple[str, str | None]:
    """(variable, key) from the environment; with --anthropic and no --api-key-env the SDK's own variables
    (neither set: no key, the rules say so). A named variable that is unset is bad input."""
    if api_key_env is None:
        if not anthropic:
            raise ValidationError(
                "give --api-key-env VAR: the environment variable holding the client's key "
                "(e.g. OPENAI_API_KEY)"
            )
        for var in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"):
            if environ.get(var):
                return var, environ[var]
        return "ANTHROPIC_API_KEY", None
    if not api_key_env.replace("_", "").isalnum():
        raise ValidationError(f"--api-key-env {api_key_env!r}: not an environment variable name")
    if api_key_env not in environ:
        raise ValidationError(f"--api-key-env {api_key_env}: the environment variable is not set")
    if not environ[api_key_env].strip():
        raise ValidationError(f"--api-key-env {api_key_env}: the environment variable is empty")
    return api_key_env, environ[api_key_env]


def script_call(endpoint: str | None, body: str | None, stream: bool) -> ScriptCall:
    """The script's request from --endpoint, --body and --stream (all checked)."""
    from pdfleet.doctor.probe import ScriptCall

    if body is None or endpoint is None:
        raise ValidationError(
            "--endpoint and --body go together: the path the script posts to and the JSON "
            "body it sends (--stream: it reads a stream)"
        )
    path = repo_path(body) if not Path(body).is_absolute() else Path(body)
    try:
        with path.open("rb") as file:  # at most one byte past the limit: /dev/zero is not read whole
            raw = file.read(MAX_BODY_BYTES + 1)
    except OSError as exc:
        raise ValidationError(f"--body {body}: cannot read it: {exc.strerror}") from None
    if len(raw) > MAX_BODY_BYTES:
        raise ValidationError(f"--body {body}: larger than {MAX_BODY_BYTES} bytes")
    try:
        data: Any = json.loads(raw)
    except ValueError as exc:
        raise ValidationError(f"--body {body}: not JSON ({exc})") from None
    except RecursionError:
        raise ValidationError(f"--body {body}: nested too deep to be a request body") from None
    if not isinstance(data, dict):
        raise ValidationError(f"--body {body}: the body must be a JSON object")
    cleaned = endpoint.strip().strip("/")
    if cleaned.startswith("v1/"):
        cleaned = cleaned[3:]
    if not cleaned or any(c in cleaned for c in "?#") or ".." in cleaned:
        raise ValidationError(f"--endpoint {endpoint!r}: a path such as chat/completions or completions")
    return ScriptCall(cleaned, data, stream)

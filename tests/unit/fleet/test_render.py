"""The review tree `invoke render` writes: each host's files under OUT/<host>/<absolute path>, with modes,
never outside OUT; every file reads back, by the program that reads it, as exactly what was meant."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any, cast
from unittest import mock

import pytest
import yaml

from pdfleet.errors import ValidationError
from pdfleet.fleet.deployment import Deployment
from pdfleet.fleet.provision import render_fleet
from pdfleet.fleet.render import RenderedFile, Renderer, write_tree
from pdfleet.gateway.keys import KeysFile
from pdfleet.gateway.policy import parse_policy
from pdfleet.model.yamlfile import parse_yaml
from pdfleet.monitoring.host_panels import HOST_ROWS
from pdfleet.monitoring.monitoring_config import dump
from tests.unit.fleet import golden
from tests.unit.fleet.helpers import REPO, deploy, profile_inventory_pairs

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py


def test_write_tree_puts_each_file_under_its_host_with_its_mode(tmp_path: Path) -> None:
    files = {
        "h1": [RenderedFile("/etc/pdfleet/a.env", "A=1\n", mode="0600")],
        "h2": [RenderedFile("/etc/systemd/system/b.service", "[Unit]\n")],
    }
    written = write_tree(files, tmp_path)
    assert written == [tmp_path / "h1/etc/pdfleet/a.env", tmp_path / "h2/etc/systemd/system/b.service"]
    assert (tmp_path / "h1/etc/pdfleet/a.env").read_text() == "A=1\n"
    assert stat.S_IMODE((tmp_path / "h1/etc/pdfleet/a.env").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "h2/etc/systemd/system/b.service").stat().st_mode) == 0o644


def test_a_rewritten_key_file_is_narrowed_before_its_content_is_written(tmp_path: Path) -> None:
    old = tmp_path / "h/etc/pdfleet/a.env"
    old.parent.mkdir(parents=True)
    old.write_text("OLD=1\n")
    old.chmod(0o644)
    modes: list[int] = []
    real_fdopen = os.fdopen

    def fdopen(fd: int, *args: Any, **kwargs: Any) -> Any:
        modes.append(stat.S_IMODE(os.fstat(fd).st_mode))  # what the file is when its content goes in
        return real_fdopen(fd, *args, **kwargs)

    with mock.patch("pdfleet.fleet.render.os.fdopen", fdopen):
        write_tree({"h": [RenderedFile("/etc/pdfleet/a.env", "A=1\n", mode="0600")]}, tmp_path)
    assert modes == [0o600]
    assert old.read_text() == "A=1\n" and stat.S_IMODE(old.stat().st_mode) == 0o600


@pytest.mark.parametrize(
    ("host", "path"),
    [
        ("../../x", "/etc/a"),
        ("{tmp}/abs", "/etc/a"),
        ("..", "/etc/a"),
        ("h", "/etc/../../../x"),
        ("", "/etc/a"),
    ],
)
def test_nothing_is_written_outside_out(tmp_path: Path, host: str, path: str) -> None:
    out = tmp_path / "a" / "b" / "out"
    files = {"ok": [RenderedFile("/etc/ok", "x\n")], host.format(tmp=tmp_path): [RenderedFile(path, "x\n")]}
    with pytest.raises(ValidationError, match="would be written outside"):
        write_tree(files, out)
    assert not any(tmp_path.iterdir()), "checked before anything is written"


def test_a_symlink_under_out_cannot_lead_outside(tmp_path: Path) -> None:
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / "h").symlink_to(elsewhere)
    with pytest.raises(ValidationError, match="would be written outside"):
        write_tree({"h": [RenderedFile("/etc/a", "x\n")]}, out)
    assert not any(elsewhere.iterdir())


def test_the_renderer_refuses_a_control_character_in_any_variable() -> None:
    renderer = Renderer(REPO / "templates")
    argv = ["/opt/v/bin/vllm", "serve", "m\nExecStartPre=/bin/sh"]
    with pytest.raises(
        ValidationError, match="vllm-router-pd.service.j2: argv: contains the control character U\\+000A"
    ):
        renderer.render(
            "vllm-router-pd.service.j2", service_user="u", kv_connector="NixlConnector", argv=argv
        )


# Valid values that still need care in each file: `%` (a systemd specifier), spaces, quotes, `$`.
TRICKY = (
    "extends: lab-cross\n"
    "model: {id: 'org/Model %z 100% v2', served_model_name: \"m $HOME 'q' \\\"x\\\" %n\"}\n"
    "gateway: {model_alias: 'alias with spaces % $x'}\n"
    "pools: {decode: {extra_args: ['--override-generation-config={\"temperature\": 0.5}']}}\n"
)


PAIRS = [*profile_inventory_pairs(), ("tricky", REPO / "inventory/lab.yml")]


def _deployment(tmp_path: Path, name: str, inventory: Path) -> Deployment:
    """A shipped (profile, inventory) pair, or the lab profile with tricky but valid strings."""
    if name != "tricky":
        return deploy(name, inventory)
    profiles = tmp_path / "profiles"
    shutil.copytree(REPO / "profiles", profiles)
    (profiles / "tricky.yml").write_text(TRICKY)
    return deploy(name, inventory, profiles)


@pytest.fixture(scope="module")
def systemd_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A scratch root for systemd-analyze holding the distribution's units, copied once per worker: each
    check installs its own units' programs and units in it and removes the units after."""
    root = tmp_path_factory.mktemp("systemd-root")
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    return root


def _systemd_verify(scratch: Path, units: list[Path]) -> str:
    """systemd-analyze's complaints about rendered units, read as systemd would on a host: from a scratch
    root holding the distribution's units (the systemd_root fixture) and the programs the units run. One
    call per set of distinct unit names (a unit named alike on two hosts is verified in the next call);
    each complaint names its unit's rendered path."""
    batches: list[dict[str, Path]] = []
    for unit in units:
        for line in unit.read_text().splitlines():
            if line.startswith("Exec") and "=" in line:
                program = scratch / shlex.split(line.split("=", 1)[1])[0].lstrip("-@:+!").lstrip("/")
                program.parent.mkdir(parents=True, exist_ok=True)
                program.touch(mode=0o755)
        batch = next((b for b in batches if unit.name not in b), None)
        if batch is None:
            batches.append(batch := {})
        batch[unit.name] = unit
    return "\n".join(problem for batch in batches if (problem := _verify_batch(scratch, batch)))


def _verify_batch(scratch: Path, batch: dict[str, Path]) -> str:
    """One systemd-analyze call over units of distinct names, installed in the scratch root's /etc."""
    etc = scratch / "etc/systemd/system"
    etc.mkdir(parents=True, exist_ok=True)
    installed = {etc / name: unit for name, unit in batch.items()}
    for target, unit in installed.items():
        shutil.copyfile(unit, target)
    proc = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", f"--root={scratch}", *map(str, installed)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    for target in installed:
        target.unlink()
    out = (proc.stdout + proc.stderr).strip()
    for target, unit in installed.items():
        out = out.replace(str(target), str(unit))
    return out + ("" if proc.returncode == 0 else f" (exit {proc.returncode})")


def _check_file(path: Path, deployment: Deployment) -> str:
    """What is wrong with one rendered file other than a unit, read by the program that will read it ('' when
    nothing)."""
    text = path.read_text()
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    if path.suffix == ".env":
        bad = [ln for ln in lines if not re.match(r"^[A-Z_][A-Z0-9_]*=\S", ln)]
        return f"not KEY=VALUE: {bad}" if bad else ""
    if path.suffix == ".list":
        return "" if len(lines) == 1 and lines[0].startswith("deb ") else f"not one deb line: {lines}"
    if path.name == "policy.yaml":
        spec = parse_policy(path, text)
        gw, first = deployment.profile.gateway, deployment.profile.served[0].gateway
        aliases = [alias for served in deployment.profile.served for alias in served.aliases]
        expected = (list(spec.models), spec.stage, set(spec.stages), spec.keys_file)
        wanted = (aliases, first.stage, set(first.stages), gw.keys_file)
        return "" if expected == wanted else f"policy: {expected}"
    if path.name == Path(deployment.profile.gateway.keys_file).name:
        keys = KeysFile.model_validate(parse_yaml(text, path))
        return "" if {k.sha256 for k in keys.keys} == {"1" * 64, "2" * 64} else "keys: wrong hashes"
    if path.name == "alertmanager.yml":
        proc = subprocess.run(["amtool", "check-config", str(path)], capture_output=True, text=True)
        return "" if proc.returncode == 0 else f"amtool check-config: {proc.stdout}{proc.stderr}"
    if path.name == "notification_recorder.py":
        compile(text, str(path), "exec")  # the host's python3 runs it as it is
        return ""
    if path.parent.name == "default" and path.name.startswith("prometheus"):
        bad = [ln for ln in lines if not re.match(r'^[A-Z_]+="[^"\n]*"$', ln)]
        return f'not KEY="VALUE": {bad}' if bad else ""
    if path.name == "prometheus.yml":
        return _promtool("config", "--syntax-only", path)
    if path.suffix in (".crt", ".key"):  # the site's PKI as provision pushes it, or render's placeholder
        pem = "CERTIFICATE-----" if path.suffix == ".crt" else "PRIVATE KEY-----"
        return "" if text.startswith("# placeholder: ") or pem in text else f"not a PEM {path.suffix}"
    if path.name == "grafana-dashboard.json":
        panels = json.loads(text).get("panels")
        graphs = [p for p in panels or [] if p.get("type") != "row"]
        return "" if graphs and all(p.get("targets") for p in graphs) else "a graph panel without a query"
    return f"no check for {path}"


def _is_rule_file(path: Path) -> bool:
    """A Prometheus rule file (checked with the others of its deployment in one promtool call)."""
    return path.parent.name == "pdfleet" and path.suffix == ".yml"


def _promtool(kind: str, *args: str | Path) -> str:
    """What `promtool check KIND` says about rendered Prometheus files (each failure names its file); empty
    when they pass."""
    proc = subprocess.run(["promtool", "check", kind, *map(str, args)], capture_output=True, text=True)
    return "" if proc.returncode == 0 else f"promtool check {kind}: {proc.stdout}{proc.stderr}"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize(("name", "inventory"), PAIRS, ids=[f"{n}@{i.name}" for n, i in PAIRS])
def test_every_rendered_file_reads_back_as_written(
    tmp_path: Path, systemd_root: Path, name: str, inventory: Path
) -> None:
    """Each file of a deployment read by what reads it on a host (systemd, promtool, the gateway's parser);
    one test per deployment, so the suite's workers share them."""
    deployment = _deployment(tmp_path, name, inventory)
    out = tmp_path / "out"
    written = write_tree(render_fleet(deployment, deployment.inventory.hosts.values()), out)
    problems = [
        f"{path.relative_to(out)}: {p}"
        for path in written
        if path.suffix != ".service" and not _is_rule_file(path) and (p := _check_file(path, deployment))
    ]
    rules = [path for path in written if _is_rule_file(path)]
    problems += [p for p in [_promtool("rules", *rules) if rules else ""] if p]
    units = [path for path in written if path.suffix == ".service"]
    assert units, written
    problems += [p for p in [_systemd_verify(systemd_root, units)] if p]
    assert not problems, "\n".join(problems)


def test_lab_cross_renders_every_kind_of_file_the_check_above_reads(tmp_path: Path) -> None:
    """lab-cross on the lab renders units, env files, an apt list and YAML: each branch of the check above
    is exercised (a kind that vanished would leave its check unread)."""
    deployment = _deployment(tmp_path, "lab-cross", REPO / "inventory/lab.yml")
    files = render_fleet(deployment, deployment.inventory.hosts.values()).values()
    kinds = {Path(f.path).suffix or Path(f.path).name for host_files in files for f in host_files}
    assert {".service", ".env", ".list", ".yaml"} <= kinds, kinds


def _without_model_labels(text: str) -> str:
    """A Prometheus config with its targets' `model:` label lines taken out (issue 24 added them)."""
    return "".join(line for line in text.splitlines(keepends=True) if not re.match(r"^ {6}model: \S+$", line))


def _without_model_grouping(text: str) -> str:
    """Recording or alert rules with the `model` label taken out of their `by (...)`/`on (...)` lists
    (issue 24: the rules keep each model's series apart)."""
    for keeps in ("by (le, ", "by (", "on ("):
        text = text.replace(f"{keeps}model, ", keeps)
    return text


RULE_FILES = ("/etc/prometheus/pdfleet/recording.yml", "/etc/prometheus/pdfleet/alerts.yml")
DASHBOARD = "/etc/prometheus/pdfleet/grafana-dashboard.json"


def _without_model_variable(text: str) -> dict[str, Any]:
    """The dashboard without its `model` variable and the matcher every per-model query carries, and
    without the first-bucket value mappings (metrics.bounds)."""
    doc = json.loads(text.replace(', model=~\\"$model\\"', "").replace('{model=~\\"$model\\"}', ""))
    doc["templating"]["list"] = [v for v in doc["templating"]["list"] if v.get("name") != "model"]
    # ... and without issue 26's first-bucket display: a value mapping `<bound` and a sentence saying so
    for panel in doc["panels"]:
        panel.get("fieldConfig", {}).get("defaults", {}).pop("mappings", None)
        if "description" in panel:
            panel["description"] = re.sub(
                r" ?Under [\d.]+ ms a quantile is inside the histogram's first bucket: shown as <[\d.]+ ms\.",
                "",
                panel["description"],
            )
    return cast(dict[str, Any], doc)


# Issue 28's files: Alertmanager's, the lab recorder's and every host's node exporter flags.
ALERTING_FILES = (
    "/etc/prometheus/alertmanager.yml",
    "/etc/default/prometheus-alertmanager",
    "/etc/default/prometheus-node-exporter",
    "/etc/systemd/system/pdfleet-notification-recorder.service",
    "/usr/local/lib/pdfleet/notification_recorder.py",
)


ISSUE_28_ALERTS = ("PdfleetPoolDown", "PdfleetCertificateExpiry")


def _without_alerting(now: dict[str, str]) -> dict[str, str]:
    """A render without issue 28's additions: its new files, the `node` job and the `alerting` section of
    prometheus.yml, the pool-down and certificate-expiry alerts and the dashboard's host rows."""
    out = {}
    for key, text in now.items():
        if key.endswith(ALERTING_FILES):
            continue
        if key.endswith("/etc/prometheus/prometheus.yml"):
            head, _, body = text.partition("\n")
            doc = yaml.safe_load(body)
            doc.pop("alerting", None)
            doc["scrape_configs"] = [j for j in doc["scrape_configs"] if j["job_name"] != "node"]
            text = head + "\n" + dump(doc)
        elif key.endswith("/etc/prometheus/pdfleet/alerts.yml"):
            head, _, body = text.partition("\n")
            doc = yaml.safe_load(body)
            for group in doc["groups"]:
                group["rules"] = [r for r in group["rules"] if r.get("alert") not in ISSUE_28_ALERTS]
            text = head + "\n" + dump(doc)
        elif key.endswith(DASHBOARD):
            doc = json.loads(text)
            first = next(i for i, p in enumerate(doc["panels"]) if p.get("title") == HOST_ROWS[0])
            doc["panels"] = doc["panels"][:first]
            text = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
        out[key] = text
    return out


def _without_stall_threshold(files: dict[str, str]) -> dict[str, str]:
    """A render without issue 33's addition: the gateway policy's stall_threshold_ms, rendered from
    slo.stall_ms when a profile sets it off the default (lab-cross's 250), so the gateway's stalls are the
    bench's."""
    return {
        key: re.sub(r"^stall_threshold_ms: .*\n", "", text, flags=re.M)
        if key.endswith("/etc/pdfleet/gateway/policy.yaml")
        else text
        for key, text in files.items()
    }


TLS_FILES = (
    "/etc/pdfleet/gateway/tls.crt",
    "/etc/pdfleet/gateway/tls.key",
    "/etc/pdfleet/tls/gateway-ca.crt",
)


def _without_tls(files: dict[str, str]) -> dict[str, str]:
    """A render with what TLS added taken out (issue 28): the site's PKI files, the policy's listen.tls,
    the gateway job's scheme and tls_config, the controller's gateway_ca_file, https admin URLs."""
    out = {}
    for key, text in files.items():
        if key.endswith(TLS_FILES):
            continue
        text = re.sub(r"^  tls:\n(    .*\n)+", "", text, flags=re.M)
        text = re.sub(r"^  scheme: https\n  tls_config:\n    ca_file: .*\n", "", text, flags=re.M)
        text = re.sub(r'^ "gateway_ca_file": .*\n', "", text, flags=re.M)
        out[key] = text.replace('"admin_url": "https://', '"admin_url": "http://')
    return out


@pytest.mark.parametrize("profile", sorted(golden.PAIRS))
def test_every_single_model_profile_renders_as_before_models_could_be_listed(profile: str) -> None:
    before = golden.golden(profile)
    now = _without_stall_threshold(_without_alerting(_without_tls(golden.rendered(profile))))
    assert sorted(now) == sorted(before), "the same files on the same hosts"
    changed = [key for key in before if now[key] != before[key]]
    # the changes allowed: the model label, on vLLM and router scrape targets and in the rules' groupings;
    # the dashboard's first-bucket mappings (issue 26)
    targets = [key for key in changed if key.endswith("/etc/prometheus/prometheus.yml")]
    rules = [key for key in changed if key.endswith(RULE_FILES)]
    dashboards = [key for key in changed if key.endswith(DASHBOARD)]
    assert sorted(targets + rules + dashboards) == sorted(changed), changed
    assert all(_without_model_labels(now[key]) == before[key] for key in targets), targets
    assert all(_without_model_grouping(now[key]) == before[key] for key in rules), rules
    assert all(_without_model_variable(now[key]) == json.loads(before[key]) for key in dashboards), dashboards

"""The task layer: every task is listed with help, and bad input exits non-zero with one paragraph
(no traceback) before anything is touched: no rendered file, no key file."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import resource
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pdfleet.cli import build_namespace
from pdfleet.fleet.secrets import PLACEHOLDER
from tests.unit.cli.helpers import invoke_many

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py

REPO = Path(__file__).resolve().parents[3]
INVOKE = [sys.executable, "-m", "invoke"]
CROSS = "inventory/examples/cross-rdma.yml"
NOTE_END = "the rendered key hashes and controller key file differ from what provision installs"


def _invoke(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*INVOKE, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def test_list_shows_every_task_with_its_help() -> None:
    out = _invoke("--list").stdout
    for name in (
        "profiles",
        "render",
        "provision",
        "verify",
        "demo",
        "lab.up",
        "lab.down",
        "lab.status",
        "lab.ssh",
        "lab.env",
    ):
        line = next((ln for ln in out.splitlines() if ln.strip().startswith(name + " ")), "")
        assert line.strip() != name and len(line.split()) > 1, f"{name} has no help line in --list"


def readme_tasks() -> set[str]:
    """The tasks the README's task table names: every backticked command in a row's first cell
    (`invoke lab.up` / `lab.down` → lab.up, lab.down)."""
    lines = (REPO / "README.md").read_text(encoding="utf-8").split("**Tasks**", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = itertools.takewhile(lambda line: line.startswith("|"), lines[start + 2 :])  # past the header
    names = set()
    for row in rows:
        first = re.split(r"(?<!\\)\|", row)[1]  # `\|` inside a cell is a literal bar
        names |= {cmd.removeprefix("invoke ").split()[0] for cmd in re.findall(r"`([^`]+)`", first)}
    return names


def test_the_readme_task_table_lists_every_task_and_no_other() -> None:
    """Each task of the namespace (or one of its aliases: `rollout` for rollout.start) has a row."""
    readme = readme_tasks()
    tasks = build_namespace().task_names
    unlisted = sorted(name for name, aliases in tasks.items() if not {name, *aliases} & readme)
    assert not unlisted, f"tasks missing from README.md's task table: {unlisted}"
    known = set(tasks) | {alias for aliases in tasks.values() for alias in aliases}
    assert readme <= known, f"README.md's task table names no such task: {sorted(readme - known)}"


HELP_TASKS = ["render", "provision"]
BARE_TASKS = ["render", "provision", "verify", "monitor", "bench"]
BAD_INPUT = [
    (["render", "--profile", "no-such-profile", "--inventory", CROSS], "available"),
    (["render", "--profile", "cross-rdma", "--inventory", "inventory/nope.yml"], "nope.yml"),
    (
        ["render", "--profile", "cross-rdma", "--inventory", "inventory/examples/same-host-pcie.yml"],
        "same-host-pcie.yml",
    ),
    (["render", "--profile", "cross-rdma", "--inventory", CROSS, "--limit", "ghost"], "ghost"),
    (["provision", "--profile", "cross-rdma", "--inventory", CROSS, "--roles", "bogus"], "bogus"),
    (["provision", "--profile", "cross-rdma", "--inventory", CROSS, "--serial", "-1"], "--serial"),
    (["provision", "--profile", "cross-rdma", "--inventory", CROSS, "--limit", "ghost,pf-01"], "ghost"),
    (["provision", "--profile", "cross-rdma", "--inventory", CROSS, "--model", "x"], "give --stage too"),
    (
        [
            "provision",
            "--profile",
            "lab-two-models",
            "--inventory",
            "inventory/lab.yml",
            "--stage",
            "colocated",
        ],
        "several models; name one (--model): llama-8b, llama-1b",
    ),
]


def _bad_argv(args: list[str], out_dir: Path) -> list[str]:
    return [*args, "--out", str(out_dir)] if args[0] == "render" else args


@pytest.fixture(scope="module")
def bad_outs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where BAD_INPUT case N's render would write: bad_outs/N/out."""
    return tmp_path_factory.mktemp("bad-input")


@pytest.fixture(scope="module")
def runs(bad_outs: Path) -> dict[tuple[str, ...], subprocess.CompletedProcess[str]]:
    """The help and bad-input commands below, each through invoke's CLI, all in one process (by argv)."""
    base = bad_outs
    cases = (
        [["--help", t] for t in HELP_TASKS] + [[t, "--help"] for t in BARE_TASKS] + [[t] for t in BARE_TASKS]
    )
    cases += [_bad_argv(args, base / str(n) / "out") for n, (args, _) in enumerate(BAD_INPUT)]
    return {tuple(case): proc for case, proc in zip(cases, invoke_many(cases), strict=True)}


@pytest.mark.parametrize("task", HELP_TASKS)
def test_every_option_has_help(
    task: str, runs: dict[tuple[str, ...], subprocess.CompletedProcess[str]]
) -> None:
    out = runs["--help", task].stdout
    options = [ln for ln in out.splitlines() if ln.strip().startswith("-")]
    assert options
    for line in options:
        assert len(line.strip().split("  ", 1)) == 2, f"no help: {line}"  # the flag, then its help


@pytest.mark.parametrize("task", BARE_TASKS)
def test_task_help_after_the_task_is_help_and_a_missing_profile_is_named(
    task: str, runs: dict[tuple[str, ...], subprocess.CompletedProcess[str]]
) -> None:
    """`invoke TASK --help` prints the task's help (it was read as a profile named --help), and a task run
    without --profile says so instead of looking up a profile named None."""
    shown = runs[task, "--help"]
    assert shown.returncode == 0 and "--profile" in shown.stdout, shown.stdout + shown.stderr
    bare = runs[(task,)]
    assert bare.returncode != 0 and "Traceback" not in bare.stdout + bare.stderr
    assert bare.stderr.startswith("error: no profile given: pass --profile NAME, one of:"), bare.stderr


@pytest.mark.parametrize(("case", "args", "expected"), [(n, *c) for n, c in enumerate(BAD_INPUT)])
def test_bad_input_is_one_paragraph_and_changes_nothing(
    case: int,
    args: list[str],
    expected: str,
    runs: dict[tuple[str, ...], subprocess.CompletedProcess[str]],
    bad_outs: Path,
) -> None:
    out_dir = bad_outs / str(case) / "out"
    proc = runs[tuple(_bad_argv(args, out_dir))]
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr + proc.stdout
    message = proc.stderr.strip()
    assert message.startswith("error:"), message
    assert expected in message
    assert "\n\n" not in message, "one paragraph"
    assert not out_dir.exists(), "nothing written on bad input"


# --------------------------------------------------------------------------- hostile input (issue 18)

LAB_INVENTORY = (REPO / "inventory/lab.yml").read_text()
BOMB = "".join(
    [f"l0: &l0 [{', '.join(['lol'] * 9)}]\n"]
    + [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]\n" for i in range(1, 10)]
)
PRIVATE = "sk-pdfleet-" + "Zq9" * 14


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        nested = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merge(out[key], value) if nested else value
    return out


@dataclass
class Site:
    """A scratch control machine: the shipped profiles, a lab-colocated profile whose key files live here,
    an inventory, an output directory, and HOME."""

    root: Path

    @property
    def keys(self) -> Path:
        return self.root / "keys"

    def profile(self, over: dict[str, Any] | None = None, raw: bytes | None = None) -> str:
        """A profile extending lab-colocated (keys under this site) with `over` merged in, or raw text."""
        directory = self.root / "profiles"
        if not directory.exists():
            shutil.copytree(REPO / "profiles", directory)
        keys = {
            "client_key_file": str(self.keys / "client.key"),
            "admin_key_file": str(self.keys / "admin.key"),
            "controller_key_file": str(self.keys / "controller.key"),
        }
        data = _merge({"extends": "lab-colocated", "gateway": keys}, over or {})
        path = directory / "case.yml"
        path.write_bytes(raw if raw is not None else json.dumps(data).encode())  # JSON is YAML
        return str(path)

    def inventory(self, text: str = LAB_INVENTORY) -> str:
        path = self.root / "inv.yml"
        path.write_text(text)
        return str(path)

    def render(
        self, *args: str, profile: str | None = None, inventory: str | None = None, out: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """`invoke render` of this site, with HOME here (so `~` key files land here too)."""
        argv = [
            "render",
            "--profile",
            profile or self.profile(),
            "--inventory",
            inventory or self.inventory(),
            "--out",
            out or str(self.root / "out"),
            *args,
        ]
        env = {**os.environ, "HOME": str(self.root / "home")}
        return subprocess.run(
            [*INVOKE, *argv], cwd=REPO, capture_output=True, text=True, timeout=120, check=False, env=env
        )

    def written(self) -> list[str]:
        """Every file under the site except its inputs: key files and rendered files."""
        inputs = {"profiles", "inv.yml"}
        return sorted(
            str(p.relative_to(self.root))
            for p in self.root.rglob("*")
            if p.is_file() and p.relative_to(self.root).parts[0] not in inputs
        )


def _refused(proc: subprocess.CompletedProcess[str], expected: str) -> str:
    """The one-paragraph error of a refused command (asserting it is one)."""
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    message = proc.stderr.strip()
    assert message.startswith("error:") and "\n\n" not in message, message
    assert expected in message, message
    return message


# (id, what the case changes: profile overrides / profile text / inventory text / option, expected text)
HOSTILE: list[tuple[str, dict[str, Any], str]] = [
    (
        "C1-model-id",
        {"profile": {"model": {"id": "m\nExecStartPre=/bin/sh -c id"}}},
        "case.yml: model.id: the value 'm\\nExecStartPre=/bin/sh -c id' "
        "contains the control character U+000A",
    ),
    (
        "C1-served-name",
        {"profile": {"model": {"served_model_name": "m\nx=y"}}},
        "model.served_model_name: the value 'm\\nx=y' contains the control character U+000A",
    ),
    ("C1-alias", {"profile": {"gateway": {"model_alias": "a\nstage: all-disagg"}}}, "gateway.model_alias:"),
    (
        "C1-kv-cache-dtype",
        {"profile": {"pools": {"colocated": {"kv_cache_dtype": "fp8\nUser=root"}}}},
        "pools.colocated.kv_cache_dtype:",
    ),
    (
        "C1-extra-args",
        {"profile": {"pools": {"colocated": {"extra_args": ["--x\nUser=root"]}}}},
        "pools.colocated.extra_args[0]:",
    ),
    (
        "C1-apt-mirror",
        {"profile": {"mirrors": {"apt": "http://m/ ./\ndeb [trusted=yes] http://evil/ ./"}}},
        "mirrors.apt:",
    ),
    (
        "C1-ansible-host",
        {
            "inventory": LAB_INVENTORY.replace(
                "ansible_host: 198.18.0.11", 'ansible_host: "198.18.0.11\\nExecStartPre=/bin/sh"'
            )
        },
        "all.children.colocated.hosts.lab-colo1.ansible_host: contains the control character U+000A",
    ),
    (
        "C2-host-parent",
        {"inventory": LAB_INVENTORY.replace("lab-colo1:", "../../x:")},
        "all.children.colocated.hosts.../../x: '../../x' is not a host name",
    ),
    (
        "C2-host-absolute",
        {"inventory": LAB_INVENTORY.replace("lab-gw:\n", "{site}/abs:\n")},
        "all.children.gateway.hosts.{site}/abs: ",
    ),
    (
        "C2-keys-file-parent",
        {"profile": {"gateway": {"keys_file": "/etc/pdfleet/../../../tmp/k.yaml"}}},
        "gateway.keys_file: must be an absolute, normalised path",
    ),
    (
        "C2-keys-file-relative",
        {"profile": {"gateway": {"keys_file": "keys.yaml"}}},
        "gateway.keys_file: must be an absolute, normalised path",
    ),
    ("C3-bomb-profile", {"raw": BOMB.encode()}, "case.yml: aliases expand the document to more than"),
    ("C3-bomb-inventory", {"inventory": BOMB}, "inv.yml: aliases expand the document to more than"),
    (
        "C4-invalid-utf8",
        {"raw": "extends: lab-colocated\ndescription: caf\xe9\n".encode("latin-1")},
        "case.yml:2: not valid UTF-8 (byte 0xe9",
    ),
    (
        "C4-deep",
        {"raw": ("a: " + "[" * 3000 + "]" * 3000 + "\n").encode()},
        "invalid YAML: nested deeper than 64 levels",
    ),
    ("C4-out-is-a-file", {"out": "file"}, "is a file, not a directory"),
    ("C4-out-below-a-file", {"out": "file/sub"}, "is below the file"),
    (
        "C5-key-file-as-inventory",
        {"inventory": PRIVATE + "\n"},
        "inv.yml: (top level): must be a mapping of groups, e.g. `all:` (got the string 'sk-p'... (53 "
        "characters))",
    ),
    ("C6-limit-nohost", {"args": ["--limit", "nohost"]}, "--limit 'nohost': unknown host or group nohost"),
    ("C6-bad-admin-key", {"admin_key": 0o644}, "admin.key: a key file must be readable by its owner only"),
    (
        "C7-same-key-file",
        {"profile": {"gateway": {"admin_key_file": "{keys}/./client.key"}}},
        "gateway.admin_key_file: is the same file as gateway.client_key_file",
    ),
    ("C8-key-path-is-a-directory", {"admin_key": "dir"}, "admin.key: is a directory, not a key file"),
    (
        "C9-stage-off",
        {"raw": b"extends: lab-colocated\ngateway: {stage: off}\n"},
        "gateway.stage: must be a string, but YAML read the unquoted value as the boolean false",
    ),
]


def _children_cpu_s() -> float:
    """CPU seconds of this process's waited-for children so far (each render is one)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@pytest.mark.parametrize(("case", "change", "expected"), HOSTILE, ids=[c[0] for c in HOSTILE])
def test_hostile_input_is_refused_in_one_paragraph_and_writes_nothing(
    tmp_path: Path, case: str, change: dict[str, Any], expected: str
) -> None:
    site = Site(tmp_path)
    over = json.loads(json.dumps(change.get("profile", {})).replace("{keys}", str(site.keys)))
    profile = site.profile(over, raw=change.get("raw"))
    out = str(tmp_path / "o1" / "o2" / "out")  # deep, so `../../x` would still land in the site
    if "out" in change:
        (tmp_path / "file").write_text("not a directory\n")
        out = str(tmp_path / change["out"])
    if "admin_key" in change:
        admin = site.keys / "admin.key"
        site.keys.mkdir()
        if change["admin_key"] == "dir":
            admin.mkdir()
        else:
            admin.write_text(PRIVATE + "\n")
            admin.chmod(change["admin_key"])
    before = site.written()
    started = _children_cpu_s()
    inventory = site.inventory(change.get("inventory", LAB_INVENTORY).replace("{site}", str(tmp_path)))
    proc = site.render(*change.get("args", []), profile=profile, inventory=inventory, out=out)
    message = _refused(proc, expected.replace("{site}", str(tmp_path)))
    # a bounded refusal (no YAML bomb expanded), in CPU seconds: wall time under a loaded machine says nothing
    assert _children_cpu_s() - started < 30
    assert "Zq9Zq9" not in proc.stdout + proc.stderr, "a key was printed"
    assert site.written() == before, f"{case}: files were written: {set(site.written()) - set(before)}"
    assert len(message) < 600


def test_render_writes_nothing_outside_out_and_says_where_keys_are_placeholders(tmp_path: Path) -> None:
    """A review command: key files provision would generate are placeholders, not new files in the
    operator's config directory (HOME and XDG_CONFIG_HOME point into tmp_path, `~` key paths with them)."""
    home, out = tmp_path / "home", tmp_path / "out"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")}
    argv = ["render", "--profile", "cross-rdma", "--inventory", CROSS, "--out", str(out)]
    proc = subprocess.run(
        [*INVOKE, *argv], cwd=REPO, capture_output=True, text=True, timeout=120, check=False, env=env
    )
    assert proc.returncode == 0, proc.stderr
    outside = [p for p in tmp_path.rglob("*") if out not in p.parents and p not in (out, home)]
    assert outside == [], f"render wrote outside --out: {outside}"
    note = proc.stdout.strip().splitlines()[-1]
    assert note.startswith("placeholders used for the gateway keys provision would generate"), proc.stdout
    assert f"{home}/.config/pdfleet/gateway-client.key" in note
    assert f"{home}/.config/pdfleet/gateway-admin.key" in note
    placeholder = hashlib.sha256(PLACEHOLDER.format(which="client").encode()).hexdigest()
    assert placeholder in (out / "gw-01/etc/pdfleet/gateway/keys.yaml").read_text()


def test_render_reads_existing_keys_and_only_for_a_gateway_it_renders(tmp_path: Path) -> None:
    site = Site(tmp_path)
    no_gateway = site.inventory(
        LAB_INVENTORY.replace(
            "    gateway:\n      hosts:\n        lab-gw:\n", "    edge:\n      hosts:\n        lab-gw:\n"
        )
    )
    proc = site.render(inventory=no_gateway)
    assert proc.returncode == 0, proc.stderr
    assert "placeholders" not in proc.stdout, "no gateway rendered, so no keys needed"
    proc = site.render("--limit", "lab-colo1")
    assert proc.returncode == 0, proc.stderr
    assert "placeholders" not in proc.stdout, "the gateway host is not selected"
    proc = site.render()
    assert proc.returncode == 0, proc.stderr
    assert "placeholders used" in proc.stdout and not site.keys.exists()
    site.keys.mkdir()
    (site.keys / "client.key").write_text(PRIVATE + "\n")
    (site.keys / "client.key").chmod(0o600)
    proc = site.render()
    assert proc.returncode == 0, proc.stderr
    missing = f"{site.keys / 'admin.key'}, {site.keys / 'controller.key'}"
    assert proc.stdout.strip().endswith(f"({missing}: not created); " + NOTE_END)
    keys = (tmp_path / "out/lab-gw/etc/pdfleet/gateway/keys.yaml").read_text()
    assert hashlib.sha256(PRIVATE.encode()).hexdigest() in keys, "an existing key is the real one"
    assert sorted(p.name for p in site.keys.iterdir()) == ["client.key"]
    assert PRIVATE not in proc.stdout + proc.stderr


@pytest.mark.parametrize("task", ["provision", "verify"])
def test_a_failing_limit_creates_no_key_file(tmp_path: Path, task: str) -> None:
    site = Site(tmp_path)
    env = {**os.environ, "HOME": str(tmp_path / "home")}
    proc = subprocess.run(
        [*INVOKE, task, "--profile", site.profile(), "--inventory", site.inventory(), "--limit", "nohost"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    _refused(proc, "unknown host or group nohost")
    assert site.written() == []


def test_loading_the_tasks_imports_none_of_their_machinery() -> None:
    # every `invoke` command loads every task module: the OpenAI and Anthropic SDKs (~5 s to import),
    # matplotlib, the bench's aiohttp, verify's pytest/testinfra, SSH (paramiko), the renderer (jinja2) and
    # the fleet's deployment belong to the commands that use them, not to `invoke --help render`
    # (`invoke --list` went from ~1.6 to ~0.45 CPU-s when the task modules stopped importing them)
    heavy = (
        "openai",
        "anthropic",
        "matplotlib",
        "aiohttp",
        "pytest",
        "testinfra",
        "paramiko",
        "jinja2",
        "pdfleet.fleet.deployment",
        "roles",
    )
    code = f"import sys, tasks; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120, check=True
    )
    assert proc.stdout.strip() == "[]"


def test_render_says_which_layout_it_shows_and_follows_the_live_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = Site(tmp_path)
    monkeypatch.setenv("INVOKE_PDFLEET_OUTPUT_DIR", str(tmp_path / "state"))
    profile = site.profile({"extends": "lab-cross"})
    inventory = site.inventory()
    out = tmp_path / "out"
    proc = site.render(profile=profile, inventory=inventory)
    assert proc.returncode == 0, proc.stderr
    assert "layout: the inventory's pool groups" in proc.stdout
    assert (out / "lab-colo2/etc/systemd/system/vllm-colocated.service").exists()
    state = tmp_path / "state/layouts/inv-case.json"
    hosts = {"lab-colo1": ["colocated"], "lab-colo2": ["decode"], "lab-p1": ["prefill"], "lab-d1": ["decode"]}
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps({"profile": profile, "inventory": inventory, "hosts": hosts}))
    shutil.rmtree(out)
    proc = site.render(profile=profile, inventory=inventory)
    assert proc.returncode == 0, proc.stderr
    assert f"the live layout as last read from the fleet's gateway hosts, copied in {state}" in proc.stdout
    assert (out / "lab-colo2/etc/systemd/system/vllm-decode.service").exists()
    assert not (out / "lab-colo2/etc/systemd/system/vllm-colocated.service").exists()

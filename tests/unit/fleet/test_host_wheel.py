"""The host wheel: exactly the code hosts run, a version that changes only with it, reproducible bytes
that pip installs, and a cache that writes it once per version."""

from __future__ import annotations

import email
import hashlib
import importlib.metadata
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from pdfleet.fleet.host_wheel import (
    ENTRY_POINTS,
    HOST_DEPENDENCIES,
    IMPORTS_CACHE_NAME,
    PACKAGE_DIR,
    TOKENIZER_EXTRA,
    cached_host_wheel,
    extra_requirements,
    host_code,
    host_files,
    host_requirements,
    host_version,
    wheel_name,
    write_host_wheel,
)
from pdfleet.hw.kv import SIM_MODULES
from tests.unit.fleet.helpers import REPO, third_party_imports

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py

# `metrics` is host code too: the rollout controller on the monitoring host reads Prometheus through it.
OPERATOR_PACKAGES = ("cli", "fleet", "ops", "hw", "lab", "checks", "bench")
# Imported by host code but provided by a host dependency or optional (tried, with a fallback).
# optional on hosts: imported only where used (tokenizers with the tokenizer extra; jinja2 only to render a
# chat template, beside the tokenizer: pdfleet.chat_template)
INDIRECT_OR_OPTIONAL = {"yarl": "aiohttp", "orjson": None, "tokenizers": None, "jinja2": None}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the pdfleet package to edit."""
    copy = tmp_path / "pdfleet"
    shutil.copytree(PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


def test_an_edit_to_operator_code_leaves_the_host_version_alone(tree: Path) -> None:
    before = host_version(tree)
    _append(tree / "cli" / "provision.py", "\n# a comment in the CLI\n")
    _append(tree / "fleet" / "topology.py", '\n"""a docstring edit"""\n')
    assert host_version(tree) == before


@pytest.mark.parametrize("edited", ["gateway/proxy.py", "gateway/policy.py", "sim/engine.py", "tokens.py"])
def test_an_edit_to_host_code_changes_the_host_version(tree: Path, edited: str) -> None:
    target = tree / edited
    if not target.exists():  # the gateway's modules may be named differently; any module of it will do
        target = sorted((tree / edited.split("/")[0]).glob("*.py"))[-1]
    before = host_version(tree)
    _append(target, "\n# changed\n")
    after = host_version(tree)
    assert after != before and after.startswith(before.split("+")[0] + "+h")


def test_a_new_import_in_host_code_brings_its_module_in_the_same_process(tree: Path) -> None:
    assert "fleet/topology.py" not in {p.relative_to(tree).as_posix() for p in host_files(tree)}
    _append(tree / "tokens.py", "\nimport pdfleet.fleet.topology  # noqa\n")
    assert "fleet/topology.py" in {p.relative_to(tree).as_posix() for p in host_files(tree)}


def _rel(tree: Path, files: list[Path]) -> set[str]:
    return {p.relative_to(tree).as_posix() for p in files}


def test_the_imports_cache_is_read_by_content_and_an_edited_file_is_parsed_again(
    tree: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache" / "imports.json"
    plain = _rel(tree, host_files(tree, cache=None))
    assert _rel(tree, host_files(tree, cache)) == plain and not cache.exists()  # read, not written
    assert _rel(tree, host_files(tree, cache, save=True)) == plain
    known = json.loads(cache.read_text())
    tokens = hashlib.sha256((tree / "tokens.py").read_bytes()).hexdigest()
    assert tokens in known and "fleet/topology.py" not in plain
    # an entry the cache holds is believed: proof that the second run read it instead of parsing
    known[tokens] = [*known[tokens], "pdfleet.fleet.topology"]
    cache.write_text(json.dumps(known))
    assert "fleet/topology.py" in _rel(tree, host_files(tree, cache))
    # an edit gives the file another key: parsed again, the planted entry no longer applies
    _append(tree / "tokens.py", "\n# edited\n")
    assert _rel(tree, host_files(tree, cache)) == plain


def test_writing_the_wheel_writes_the_imports_cache_beside_it(tmp_path: Path) -> None:
    wheel = cached_host_wheel(tmp_path / "wheels")
    known = json.loads((wheel.parent / IMPORTS_CACHE_NAME).read_text())
    assert hashlib.sha256((PACKAGE_DIR / "tokens.py").read_bytes()).hexdigest() in known


def test_a_full_imports_cache_keeps_only_the_entries_of_the_sources_read(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "imports.json"
    monkeypatch.setattr("pdfleet.fleet.host_wheel.IMPORTS_CACHE_MAX", 3)
    cache.write_text(json.dumps({f"stale-{n}": [] for n in range(4)}))
    files = host_files(tree, cache, save=True)
    kept = set(json.loads(cache.read_text()))
    read = {hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    # every entry kept is a source the walk read; the stale ones are gone
    assert not any(key.startswith("stale-") for key in kept) and kept <= read
    assert hashlib.sha256((tree / "tokens.py").read_bytes()).hexdigest() in kept


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"a": "not a list"}'])
def test_an_unreadable_imports_cache_is_rebuilt(tree: Path, tmp_path: Path, content: str) -> None:
    cache = tmp_path / "imports.json"
    cache.write_text(content)
    assert _rel(tree, host_files(tree, cache, save=True)) == _rel(tree, host_files(tree, cache=None))
    assert isinstance(json.loads(cache.read_text()), dict)


def test_an_imports_cache_that_cannot_be_written_costs_nothing_but_the_parse(
    tree: Path, tmp_path: Path
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    cache = blocker / "imports.json"  # its directory is a file: nothing can be written there
    assert _rel(tree, host_files(tree, cache, save=True)) == _rel(tree, host_files(tree, cache=None))
    assert not cache.exists() and blocker.read_text() == ""


def test_host_code_is_the_host_packages_and_what_they_import() -> None:
    files = {p.relative_to(PACKAGE_DIR).as_posix() for p in host_files()}
    assert {"gateway/cli.py", "sim/cli.py", "__init__.py", "errors.py", "tokens.py"} <= files
    assert {"model/vllm_releases.py", "model/vllm_release_data.py"} <= files  # the release the sim models
    assert {"rollout/cli.py", "metrics/prometheus.py"} <= files  # the rollout controller and its reader
    assert "model/profile.py" not in files and "model/profile_loader.py" not in files
    leaked = sorted(f for f in files if f.split("/")[0] in OPERATOR_PACKAGES)
    assert not leaked, f"host code imports operator code: {leaked}"


def _beside_the_simulator() -> set[str]:
    """The distributions the kv_transfer role installs into the simulator's venv (kv_transfer.sim_library),
    normalised: pdfleet/sim imports them only when a profile turns the library on."""
    from pdfleet.hw.kv import sim_requirements
    from pdfleet.model.connectors import MOONCAKE, NIXL

    return {
        Requirement(r).name.lower().replace("_", "-")
        for connector in (NIXL, MOONCAKE)
        for reqs, _ in sim_requirements(connector)
        for r in reqs
    }


def test_host_requirements_cover_every_third_party_import() -> None:
    def normal(name: str) -> str:
        return name.lower().replace("_", "-")

    provided = {normal(n) for n in HOST_DEPENDENCIES}
    by_module = importlib.metadata.packages_distributions()
    files = host_files()
    # imported outside the simulator too: then it must be a host dependency like any other
    elsewhere = third_party_imports(p for p in files if p.relative_to(PACKAGE_DIR).parts[0] != "sim")
    for module in sorted(third_party_imports(files)):
        if module in INDIRECT_OR_OPTIONAL:
            continue
        if normal(SIM_MODULES.get(module, module)) in _beside_the_simulator() and module not in elsewhere:
            continue
        dists = {normal(d) for d in by_module.get(module, [])}
        assert dists & provided, f"host code imports {module} ({dists or 'unknown'}), not a host dependency"


def test_the_tokenizer_extra_brings_what_rendering_a_chat_template_imports() -> None:
    """pdfleet.chat_template renders with jinja2 (imported only where a template is rendered), so a host that
    runs the tokenizer gets jinja2 with it, under pdfleet's own specifier; hosts without the extra do not."""
    extra = {Requirement(r).name for r in extra_requirements(TOKENIZER_EXTRA)}
    assert extra == {"tokenizers", "jinja2"}
    core = [r for r in host_requirements() if "extra ==" not in r]
    assert not any(Requirement(r).name in extra for r in core)
    jinja = next(r for r in importlib.metadata.requires("pdfleet") or [] if r.startswith("jinja2"))
    assert f'{jinja}; extra == "{TOKENIZER_EXTRA}"' in host_requirements()


def test_the_wheel_is_reproducible_and_pip_installs_it(tmp_path: Path) -> None:
    first = write_host_wheel(tmp_path / "a")
    second = write_host_wheel(tmp_path / "b")
    assert first.name == wheel_name(host_version()) and first.read_bytes() == second.read_bytes()
    with zipfile.ZipFile(first) as zf:
        names = set(zf.namelist())
        meta = email.message_from_bytes(zf.read(f"pdfleet-{host_version()}.dist-info/METADATA"))
    assert names >= set(host_code().files) and not any(n.startswith("pdfleet/cli/") for n in names)
    assert meta["Version"] == host_version() and meta["Name"] == "pdfleet"
    assert any(r.startswith("aiohttp") for r in meta.get_all("Requires-Dist"))
    target = tmp_path / "site"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--quiet",
            "--disable-pip-version-check",
            "--target",
            str(target),
            str(first),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert (target / "pdfleet" / "gateway").is_dir() and not (target / "pdfleet" / "cli").exists()
    scripts = (target / f"pdfleet-{host_version()}.dist-info" / "entry_points.txt").read_text()
    for script, target_ref in ENTRY_POINTS:
        assert f"{script} = {target_ref}" in scripts


def test_the_cache_writes_once_per_version_and_drops_older_ones(tmp_path: Path) -> None:
    current = tmp_path / wheel_name(host_version())
    current.write_bytes(b"cached")
    old = tmp_path / wheel_name("0.1.0+h000000000000")
    old.write_bytes(b"old")
    assert cached_host_wheel(tmp_path) == current
    assert current.read_bytes() == b"cached"  # not written again
    assert not old.exists()
    fresh = cached_host_wheel(tmp_path / "empty")
    assert zipfile.is_zipfile(fresh)


def test_invoke_wheel_prints_the_version_without_writing(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", "wheel", "--print-version"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == host_version()
    built = subprocess.run(
        [sys.executable, "-m", "invoke", "wheel", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built.returncode == 0, built.stderr
    assert Path(built.stdout.strip()) == tmp_path / wheel_name(host_version())

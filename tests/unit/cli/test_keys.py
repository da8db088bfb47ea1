"""`invoke keys.*` at the task layer with --no-apply (the apply step is provision's gateway role): the
registry and key files they leave, what keys.list shows (never a key), and bad options refused before
anything is written."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from invoke.exceptions import Exit

from pdfleet.cli import keys
from pdfleet.fleet import named_keys
from tests.unit.cli.helpers import REPO, project_context


def _profile(tmp_path: Path) -> tuple[str, Path]:
    """lab-cross with its named keys under `tmp_path`: the profile's path and that directory."""
    profiles = tmp_path / "profiles"
    shutil.copytree(REPO / "profiles", profiles)
    keys_dir = tmp_path / "keys"
    doc = {"extends": "lab-cross", "gateway": {"keys_dir": str(keys_dir)}}
    (profiles / "lab-keys.yml").write_text(yaml.safe_dump(doc))
    return str(profiles / "lab-keys.yml"), keys_dir


def test_add_rotate_list_revoke_without_applying(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile, keys_dir = _profile(tmp_path)
    ctx = project_context()
    keys.add(ctx, profile, "team-a", models="llama-3.1-8b", concurrent="4", apply=False)
    key_file = keys_dir / "team-a.key"
    first = key_file.read_text().strip()
    keys.rotate(ctx, profile, "team-a", grace_minutes="30", apply=False)
    second = key_file.read_text().strip()
    assert first != second
    keys.list_(ctx, profile, offline=True)
    out = capsys.readouterr().out
    assert f"hand its file to the client: {key_file}" in out and "the old one works until" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("team-a ")]
    assert [r[2] for r in rows] == ["grace", "active"] and all(
        r[-2:] == ["llama-3.1-8b", "never"] for r in rows
    )
    assert first not in out and second not in out
    entries = named_keys.read_registry(keys_dir)
    assert entries[-1].limits is not None and entries[-1].limits.concurrent_streams == 4
    keys.revoke(ctx, profile, "team-a", apply=False)
    assert named_keys.read_registry(keys_dir) == () and not key_file.exists()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"models": "gpt-9"}, "--models: gpt-9: not a model alias (aliases: llama-3.1-8b)"),
        ({"concurrent": "0"}, "--concurrent: '0' is not a whole number of at least 1"),
        ({"expires_days": "soon"}, "--expires-days: 'soon' is not a number"),
        ({"name": "admin"}, "key name 'admin' is the profile's own key"),
    ],
)
def test_bad_options_are_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: dict[str, str], message: str
) -> None:
    profile, keys_dir = _profile(tmp_path)
    name = options.pop("name", "team-a")
    with pytest.raises(Exit):
        keys.add(project_context(), profile, name, apply=False, **options)
    assert message in capsys.readouterr().err
    assert not keys_dir.exists()


@pytest.mark.procs  # starts invoke
def test_the_tasks_are_listed_and_every_option_has_help() -> None:
    for name in ("keys.add", "keys.list", "keys.rotate", "keys.revoke"):
        run = [sys.executable, "-m", "invoke", "--help", name]
        out = subprocess.run(run, cwd=REPO, capture_output=True, text=True, timeout=120).stdout
        options = [ln for ln in out.splitlines() if ln.strip().startswith("-")]
        assert options
        for line in options:
            assert len(line.strip().split("  ", 1)) == 2, f"{name}: no help: {line}"

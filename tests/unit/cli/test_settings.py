"""invoke.yaml's `pdfleet:` section, read in one place: repo-relative paths, and clear errors."""

from __future__ import annotations

import pytest
from invoke import Context

from pdfleet.cli.settings import Settings
from pdfleet.errors import ValidationError
from tests.unit.cli.helpers import REPO, project_context


def test_the_repo_defaults_point_at_the_lab_and_the_repo_folders() -> None:
    settings = Settings.of(project_context())
    assert settings.inventory == REPO / "inventory" / "lab.yml"
    assert settings.profiles_dir == REPO / "profiles" and settings.templates_dir == REPO / "templates"
    assert settings.output_dir == REPO / "out" and settings.connect_timeout > 0
    assert not settings.known_hosts.startswith("~")


def test_overrides_win_and_absolute_paths_stay(tmp_path) -> None:  # type: ignore[no-untyped-def]
    settings = Settings.of(project_context(profiles_dir=str(tmp_path), connect_timeout=3))
    assert settings.profiles_dir == tmp_path and settings.connect_timeout == 3.0


def test_a_missing_section_or_key_or_a_bad_timeout_is_named() -> None:
    with pytest.raises(ValidationError, match="no `pdfleet:` section"):
        Settings.of(Context())
    with pytest.raises(ValidationError, match="pdfleet.inventory: required key is missing"):
        Settings.of(project_context(inventory=""))
    with pytest.raises(ValidationError, match="pdfleet.connect_timeout: must be a positive number"):
        Settings.of(project_context(connect_timeout="soon"))

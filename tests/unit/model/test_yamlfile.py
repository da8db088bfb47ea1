"""Reading operators' YAML: duplicate keys and syntax errors are ValidationErrors naming file:line:col."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdfleet.errors import ValidationError
from pdfleet.model.yamlfile import read_yaml


def test_a_duplicate_key_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "dup.yml"
    path.write_text("a: 1\nb:\n  c: 2\n  c: 3\n")
    with pytest.raises(ValidationError, match=rf"{path}:4:3: .*duplicate key 'c'"):
        read_yaml(path)


def test_syntax_errors_and_missing_files_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("a: [1, 2\n")
    with pytest.raises(ValidationError, match=rf"{bad}:\d+:\d+: invalid YAML"):
        read_yaml(bad)
    with pytest.raises(ValidationError, match="file not found"):
        read_yaml(tmp_path / "nope.yml")


def test_only_plain_data_is_built(tmp_path: Path) -> None:
    path = tmp_path / "tagged.yml"
    path.write_text("a: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(ValidationError, match="invalid YAML"):
        read_yaml(path)
    (tmp_path / "ok.yml").write_text("a: [1, {b: c}]\n")
    assert read_yaml(tmp_path / "ok.yml") == {"a": [1, {"b": "c"}]}

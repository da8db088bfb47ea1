"""One wording for every validated YAML file: `file: key.path: problem`, allowed keys listed, one line per
location, the file that set a key named when several files merge."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, Field
from pydantic import ValidationError as PydanticValidationError

from pdfleet.model.schema_errors import schema_problems


class _Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    port: int = Field(ge=1, le=65535)


class _Root(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = "set by code"
    pools: dict[str, _Inner]
    gpus: list[int] = []


def _problems(data: dict, source: Path | object = Path("f.yml"), hidden: tuple[str, ...] = ()) -> list[str]:
    with pytest.raises(PydanticValidationError) as exc:
        _Root.model_validate(data)
    return schema_problems(exc.value, _Root, source, hidden)  # type: ignore[arg-type]


def test_unknown_keys_list_what_is_allowed_except_hidden_ones() -> None:
    [line] = _problems({"pools": {}, "tagline": 1}, hidden=("name",))
    assert line == "f.yml: tagline: unknown key; allowed: pools, gpus"
    [nested] = _problems({"pools": {"d": {"port": 1, "prot": 2}}})
    assert nested == "f.yml: pools.d.prot: unknown key; allowed: port"


def test_bounds_types_and_missing_keys_read_like_a_person_wrote_them() -> None:
    lines = _problems({"pools": {"d": {"port": 0}}, "gpus": ["x"]})
    assert "f.yml: pools.d.port: must be >= 1 (got 0)" in lines
    assert "f.yml: gpus[0]: must be an integer (got 'x')" in lines
    assert _problems({}) == ["f.yml: pools: required key is missing"]


def test_each_key_can_be_reported_against_the_file_that_set_it() -> None:
    def file_of(dotted: str) -> Path:
        return Path("base.yml") if dotted.startswith("pools") else Path("child.yml")

    lines = _problems({"pools": {"d": {"port": 0}}, "tagline": 1}, source=file_of)
    assert any(line.startswith("base.yml: pools.d.port:") for line in lines)
    assert any(line.startswith("child.yml: tagline:") for line in lines)

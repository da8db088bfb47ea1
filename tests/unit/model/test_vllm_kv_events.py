"""The KV-event table against each cached wheel's own sources: the events' fields in order (required ones
first), whether an event is an array or a map, the batch's fields, and `KVEventsConfig`'s keys and
defaults (tests/unit/gateway/test_kv_events.py decodes bytes the wheels' classes encode)."""

from __future__ import annotations

import ast

import pytest

from pdfleet.model.vllm_kv_events import CONFIG_SOURCE, FORMATS, SOURCE, event_format
from tests.unit.model.helpers import wheel_source


def _classes(source: str) -> dict[str, ast.ClassDef]:
    return {n.name: n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef)}


def _fields(cls: ast.ClassDef) -> tuple[tuple[str, ...], int]:
    """Annotated fields in order and how many have no default."""
    names = [s for s in cls.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
    required = sum(1 for s in names if s.value is None)
    return tuple(s.target.id for s in names if isinstance(s.target, ast.Name)), required


def _array_like(cls: ast.ClassDef) -> bool:
    return any(k.arg == "array_like" and ast.literal_eval(k.value) is True for k in cls.keywords)


@pytest.mark.parametrize("version", sorted(FORMATS))
def test_the_table_is_the_wheels_event_classes(version: str) -> None:
    fmt = FORMATS[version]
    classes = _classes(wheel_source(version, SOURCE))
    assert _fields(classes["EventBatch"])[0] == fmt.batch and _array_like(classes["EventBatch"])
    assert _array_like(classes["KVCacheEvent"]) == fmt.events_array_like
    assert any(k.arg == "tag" for k in classes["KVCacheEvent"].keywords)
    assert _fields(classes["BlockStored"]) == (fmt.stored, fmt.stored_required)
    assert _fields(classes["BlockRemoved"]) == (fmt.removed, fmt.removed_required)
    assert _fields(classes["AllBlocksCleared"]) == ((), 0)
    (events,) = (s for s in classes["KVEventBatch"].body if isinstance(s, ast.AnnAssign))
    union = {ast.unparse(e) for e in ast.walk(events.annotation) if isinstance(e, ast.Name)}
    assert union - {"list", "Union"} == {"BlockStored", "BlockRemoved", "AllBlocksCleared"}


@pytest.mark.parametrize("version", sorted(FORMATS))
def test_the_table_is_the_wheels_config(version: str) -> None:
    cls = _classes(wheel_source(version, CONFIG_SOURCE))["KVEventsConfig"]
    found = {}
    for s in cls.body:
        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.value is not None:
            value = s.value
            if isinstance(value, ast.Call):  # pydantic's Field(default=...)
                value = next(k.value for k in value.keywords if k.arg == "default")
            found[s.target.id] = ast.literal_eval(value)
    assert tuple(found.items()) == FORMATS[version].config


def test_an_untabled_release_has_no_format() -> None:
    assert event_format("0.10.0") is None and event_format("0.33.0") is FORMATS["0.33.0"]

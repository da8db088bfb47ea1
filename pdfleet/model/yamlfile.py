"""Reading the YAML files operators write (inventories, profiles): strict about duplicate keys, and
every syntax error a ValidationError with file:line:col."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from pdfleet.errors import ValidationError


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate mapping keys (PyYAML silently keeps the last one)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    """Build a dict, failing on a key that appears twice in the same mapping, with its line."""
    loader.flatten_mapping(node)
    result: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in result:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found duplicate key {key!r}",
                key_node.start_mark,
            )
        result[key] = loader.construct_object(value_node, deep=deep)
    return result


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_yaml(path: Path) -> Any:
    """Parse one YAML file; syntax errors and duplicate keys become a ValidationError with file:line:col."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValidationError(f"{path}: file not found") from None
    except OSError as exc:
        raise ValidationError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        return yaml.load(text, Loader=_StrictLoader)  # _StrictLoader is a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        what = " ".join(p for p in (exc.context, exc.problem) if p)
        raise ValidationError(f"{where}: invalid YAML: {what}") from None
    except yaml.YAMLError as exc:
        raise ValidationError(f"{path}: invalid YAML: {exc}") from None

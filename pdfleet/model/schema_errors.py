"""Pydantic errors as pdfleet's `FILE: key.path: problem` lines, for every YAML file pdfleet validates.

One wording everywhere (profiles, the gateway's policy and keys files): `unknown key; allowed: ...`,
`required key is missing`, `must be <= 0.98 (got 0.99)`. Used on both sides (host code too), so it
imports only the model's YAML reader (for the masked excerpt of a value).
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Annotated, Any, Union

from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError

from pdfleet.model.yamlfile import excerpt, key_path


def _model_at(root: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that validates the mapping at `loc` (to list its allowed keys)."""
    current: Any = root
    for part in loc:
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return None
            current = field.annotation
        else:
            current = _container_item(current)
        current = _unwrap(current)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    """Strip Optional/Annotated to the model or container type underneath."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            annotation = args[0] if len(args) == 1 else annotation
            if len(args) != 1:
                return annotation
        else:
            return annotation


def _container_item(annotation: Any) -> Any:
    """The item type of list[X] / dict[str, X]."""
    args = typing.get_args(annotation)
    return args[-1] if args else None


def _allowed_keys(root: type[BaseModel], loc: tuple[Any, ...], hidden: Collection[str]) -> str:
    """The keys a mapping at `loc` accepts, for unknown-key errors (`hidden`: top-level keys set by code)."""
    model = _model_at(root, loc)
    if model is None:
        return ""
    keys = [k for k in model.model_fields if not (model is root and k in hidden)]
    return "; allowed: " + ", ".join(keys)


# What YAML 1.1 (PyYAML) reads as a boolean when unquoted.
_YAML_BOOLEANS = {True: "yes, on and true", False: "no, off and false"}


def _not_a_string(value: Any, show_values: bool) -> str | None:
    """For a string key given a value YAML typed by itself (`stage: off`, `version: 0.11`): say so, and
    to quote it; None for other values."""
    if isinstance(value, bool):
        shown = f" {str(value).lower()}" if show_values else ""
        return (
            f"must be a string, but YAML read the unquoted value as the boolean{shown} (it reads "
            f'unquoted {_YAML_BOOLEANS[value]} that way); quote it, e.g. "off"'
        )
    if isinstance(value, int | float):
        shown = f" {value!r}" if show_values else ""
        example = f'"{value!r}"' if show_values else '"0.11"'
        return f"must be a string, but YAML read the unquoted value as the number{shown}; quote it: {example}"
    return None


def _message(err: Mapping[str, Any], show_values: bool) -> str:
    """A short operator-facing message for one pydantic error."""
    kind, ctx, value = err["type"], err.get("ctx", {}), err.get("input")
    if kind == "string_type" and (typed := _not_a_string(value, show_values)):
        return typed
    got = f" (got {excerpt(value)})" if show_values and not isinstance(value, dict | list) else ""
    bounds = {"less_than_equal": "<=", "less_than": "<", "greater_than": ">", "greater_than_equal": ">="}
    if kind in bounds:
        key = {"<=": "le", "<": "lt", ">": "gt", ">=": "ge"}[bounds[kind]]
        return f"must be {bounds[kind]} {ctx.get(key)}{got}"
    simple = {
        "int_type": "must be an integer",
        "int_parsing": "must be an integer",
        "float_parsing": "must be a number",
        "bool_parsing": "must be true or false",
        "float_type": "must be a number",
        "bool_type": "must be true or false",
        "string_type": "must be a string",
        "list_type": "must be a list",
        "dict_type": "must be a mapping",
        "model_type": "must be a mapping",
        "string_pattern_mismatch": f"must match {ctx.get('pattern')}",
    }
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    if kind in simple:
        return simple[kind] + got
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}{got}"
    if kind == "too_short":
        return f"must have at least {ctx.get('min_length')} item(s)"
    if kind == "value_error":
        return str(ctx.get("error", err["msg"]))
    return err["msg"][0].lower() + err["msg"][1:] + got


def schema_problems(
    exc: PydanticValidationError,
    root: type[BaseModel],
    source: Path | Callable[[str], Path],
    hidden: Collection[str] = (),
    show_values: bool = True,
) -> list[str]:
    """`file: key.path: message` lines, one per distinct error location.

    `source` is the file, or a function giving the file that set a key path (profiles merged through
    `extends:`); `hidden` names top-level fields set by code rather than the file (not listed as allowed);
    `show_values=False` keeps the offending values out of the message (files that hold secrets or hashes).
    """
    file_of = source if callable(source) else (lambda _dotted: source)
    lines: list[str] = []
    seen: set[str] = set()
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        is_key = bool(loc) and loc[-1] == "[key]"  # a mapping's key rather than its value
        if is_key:  # pydantic puts the key's index there; name the key as the file wrote it
            key = err.get("input")
            loc = (*loc[:-2], str(key).lower() if isinstance(key, bool) else str(key))
        dotted = key_path(loc)
        if dotted in seen:
            continue
        seen.add(dotted)
        message = ("the key " if is_key else "") + _message(err, show_values)
        if err["type"] == "extra_forbidden":
            message += _allowed_keys(root, loc[:-1], hidden)
        lines.append(f"{file_of(dotted)}: {dotted}: {message}")
    return lines

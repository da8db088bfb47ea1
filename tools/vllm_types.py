"""What an annotation of a vLLM config field says about its `vllm serve` option, read from the tree as
`get_kwargs` reads the live type: its kinds (`hints`), its `Literal` values (argparse `choices`, or only a
metavar beside `str`), and an explicit `type=`/`choices=` of an `add_argument` call.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from tools.vllm_ast import NotConstant, const


def aliases(tree: ast.Module) -> dict[str, ast.expr]:
    """Module-level type aliases (`BlockSize = Literal[...]`, `X: TypeAlias = ...`)."""
    out: dict[str, ast.expr] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = node.value
        elif (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.value is not None
            and "TypeAlias" in ast.unparse(node.annotation)
        ):
            out[node.target.id] = node.value
    return out


def hints(node: ast.expr, aliases: dict[str, ast.expr], depth: int = 0) -> Iterator[str]:
    """The kinds in a union annotation: None, bool, str, int, float, list, tuple, set, dict, Literal,
    or a class name (aliases followed a few steps, string annotations parsed)."""
    if depth > 5:
        yield "other"
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield from hints(ast.parse(node.value, mode="eval").body, aliases, depth + 1)
    elif isinstance(node, ast.Constant) and node.value is None:
        yield "None"
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        yield from hints(node.left, aliases, depth)
        yield from hints(node.right, aliases, depth)
    elif isinstance(node, ast.Subscript):
        base = ast.unparse(node.value).rsplit(".", 1)[-1]
        inner = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if base in ("Optional", "Union"):
            yield from (h for item in inner for h in hints(item, aliases, depth))
            if base == "Optional":
                yield "None"
        elif base in ("Annotated", "SkipValidation", "InitVar"):
            yield from hints(inner[0], aliases, depth)
        elif base == "tuple":
            fixed = "..." not in ast.unparse(node.slice)
            yield f"tuple:{len(inner)}" if fixed else "tuple:+"
        else:
            yield {"List": "list", "Dict": "dict", "Tuple": "tuple:+", "Set": "set"}.get(base, base)
    elif isinstance(node, ast.Name | ast.Attribute):
        name = ast.unparse(node).rsplit(".", 1)[-1]
        if isinstance(node, ast.Name) and node.id in aliases and aliases[node.id] is not node:
            yield from hints(aliases[node.id], aliases, depth + 1)
        else:
            yield name
    else:
        yield "other"


def literals(node: ast.expr, aliases: dict[str, ast.expr], depth: int = 0) -> list[object]:
    """The values of every `Literal[...]` in an annotation (aliases followed, as `_hints` follows them)."""
    if depth > 5:
        return []
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            return literals(ast.parse(node.value, mode="eval").body, aliases, depth + 1)
        except SyntaxError:
            return []
    if isinstance(node, ast.Name) and node.id in aliases and aliases[node.id] is not node:
        return literals(aliases[node.id], aliases, depth + 1)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return literals(node.left, aliases, depth) + literals(node.right, aliases, depth)
    if isinstance(node, ast.Subscript):
        base = ast.unparse(node.value).rsplit(".", 1)[-1]
        inner = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if base == "Literal":
            return [e.value for e in inner if isinstance(e, ast.Constant)]
        if base in ("Optional", "Union", "Annotated", "SkipValidation", "InitVar"):
            items = inner if base in ("Optional", "Union") else inner[:1]
            return [v for item in items for v in literals(item, aliases, depth)]
    return []


def typing_of(
    kwargs: dict[str, ast.expr], hints: set[str], literals: list[object]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(types, choices) of an option: its annotation's kinds and Literal values (sorted by value, as
    `literal_to_kwargs` sorts them), or an explicit `type=`/`choices=` of its add_argument call."""
    types = tuple(sorted(h for h in hints if h != "None"))
    choices = sorted_text(literals)
    if kwargs.get("type") is not None:
        types = (ast.unparse(kwargs["type"]),)
    if kwargs.get("choices") is not None:
        try:
            value = const(kwargs["choices"])
        except NotConstant:
            value = None
        if isinstance(value, list):
            choices = sorted_text(value)
    return types, choices


def sorted_text(values: list[object]) -> tuple[str, ...]:
    """Values sorted as Python sorts them (numbers numerically, else as text), then as text."""
    unique = list(dict.fromkeys(values))
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in unique):
        return tuple(str(v) for v in sorted(unique, key=lambda v: float(str(v))))
    return tuple(sorted(str(v) for v in unique))

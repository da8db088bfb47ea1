"""Reading vLLM's Python sources as syntax trees: a wheel's .py files, and the few expression forms
its facts are written in (literals, list arithmetic, `range` comprehensions, names bound earlier).

Nothing here imports or runs vLLM: values are computed from the tree, and anything that is not a
plain constant expression is kept as its source text.
"""

from __future__ import annotations

import ast
import operator
import zipfile
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Pow: operator.pow,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
}


class NotConstant(Exception):
    """An expression whose value depends on more than constants (kept as source text instead)."""


@dataclass
class Sources:
    """The .py files of one vLLM release by wheel path (`vllm/envs.py`), parsed on demand."""

    version: str
    files: dict[str, str]
    _trees: dict[str, ast.Module] = field(default_factory=dict)

    @classmethod
    def from_wheel(cls, wheel: Path, version: str) -> Sources:
        """Every `vllm/**.py` of a wheel, read with zipfile (nothing is imported or unpacked)."""
        with zipfile.ZipFile(wheel) as archive:
            files = {
                name: archive.read(name).decode("utf-8")
                for name in archive.namelist()
                if name.startswith("vllm/") and name.endswith(".py")
            }
        return cls(version, files)

    @classmethod
    def from_dir(cls, root: Path, version: str) -> Sources:
        """An unpacked tree (`root/vllm/...`); `X.py.txt` stands for `X.py` (source excerpts kept as
        test fixtures, so no tool takes them for code of this project)."""
        files = {}
        for path in sorted(root.rglob("*.py*")):
            name = path.relative_to(root).as_posix().removesuffix(".txt")
            if name.endswith(".py"):
                files[name] = path.read_text(encoding="utf-8")
        return cls(version, files)

    def has(self, path: str) -> bool:
        """Whether the release ships this file."""
        return path in self.files

    def tree(self, path: str) -> ast.Module:
        """The parsed module at a wheel path (KeyError names the path if the release lacks it)."""
        if path not in self._trees:
            if path not in self.files:
                raise KeyError(f"vLLM {self.version} has no {path}")
            self._trees[path] = ast.parse(self.files[path], filename=path)
        return self._trees[path]

    def module_files(self, dotted: str) -> list[str]:
        """The files of a dotted module: the one .py, or every .py of the package, sorted."""
        base = dotted.replace(".", "/")
        if f"{base}.py" in self.files:
            return [f"{base}.py"]
        depth = base.count("/") + 1
        return sorted(p for p in self.files if p.startswith(f"{base}/") and p.count("/") == depth)


def const(node: ast.AST, scope: dict[str, object] | None = None) -> object:
    """The value of a constant expression; names are looked up in scope; NotConstant otherwise."""
    scope = scope or {}
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return [const(elt, scope) for elt in node.elts]
    if isinstance(node, ast.Dict):
        keys = [key for key in node.keys if key is not None]  # None: a `**mapping` spread
        if len(keys) != len(node.keys):
            raise NotConstant(ast.unparse(node))
        pairs = zip(keys, node.values, strict=True)
        return {_hashable(const(k, scope), k): const(v, scope) for k, v in pairs}
    if isinstance(node, ast.Name) and node.id in scope:
        return scope[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        operand = const(node.operand, scope)
        if isinstance(operand, int | float):
            return -operand
        raise NotConstant(ast.unparse(node))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](const(node.left, scope), const(node.right, scope))
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice):
        value = const(node.value, scope)
        ends = (node.slice.lower, node.slice.upper)
        lower, upper = (None if b is None else const_int(b, scope) for b in ends)
        if isinstance(value, list | tuple | str):
            return value[lower:upper]
        raise NotConstant(ast.unparse(node))
    if isinstance(node, ast.ListComp) and len(node.generators) == 1:
        return _comprehension(node, scope)
    if (  # `tuple(2 ** (10 + i) for i in range(1, 25, 2))`
        _is_call(node, "tuple")
        and isinstance(node, ast.Call)
        and len(node.args) == 1
        and isinstance(node.args[0], ast.GeneratorExp)
        and len(node.args[0].generators) == 1
    ):
        gen = node.args[0]
        return _comprehension(ast.ListComp(elt=gen.elt, generators=gen.generators), scope)
    raise NotConstant(ast.unparse(node))


def _comprehension(node: ast.ListComp, scope: dict[str, object]) -> list[object]:
    """`[expr for x in range(...)]` with constant range arguments."""
    gen = node.generators[0]
    call = gen.iter
    if gen.ifs or not isinstance(gen.target, ast.Name) or not isinstance(call, ast.Call):
        raise NotConstant(ast.unparse(node))
    args = [const(a, scope) for a in call.args]
    bounds = [a for a in args if isinstance(a, int)]
    if not _is_call(call, "range") or len(bounds) != len(args):
        raise NotConstant(ast.unparse(node))
    return [const(node.elt, {**scope, gen.target.id: i}) for i in range(*bounds)]


def const_int(node: ast.AST, scope: dict[str, object] | None = None) -> int:
    """A constant expression taken as `int()` takes it (5600, 5600.0, "5600"); NotConstant otherwise."""
    value = const(node, scope)
    if isinstance(value, int | float | str):
        try:
            return int(value)
        except ValueError:
            pass
    raise NotConstant(f"{ast.unparse(node)} is not an integer")


def _hashable(value: object, node: ast.AST) -> Hashable:
    """A dict key's value: a list (from a tuple literal) becomes a tuple again; anything else unhashable
    is NotConstant."""
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, Hashable):
        return value
    raise NotConstant(ast.unparse(node))


def const_or_text(node: ast.AST, scope: dict[str, object] | None = None) -> object:
    """The constant value, or the expression's source text when it is not constant."""
    try:
        return const(node, scope)
    except NotConstant:
        return ast.unparse(node)


def call_name(node: ast.AST) -> str | None:
    """`f` for `f(...)` and `obj.f(...)`, else None."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    if isinstance(func, ast.Name):
        return func.id
    return func.attr if isinstance(func, ast.Attribute) else None


def _is_call(node: ast.AST, name: str) -> bool:
    """Whether node is a call of `name` (bare or as an attribute)."""
    return call_name(node) == name


def calls(tree: ast.AST, name: str) -> Iterator[ast.Call]:
    """Every call of `name` (bare or attribute) inside a tree, in source order."""
    found = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and call_name(n) == name]
    yield from sorted(found, key=lambda n: (n.lineno, n.col_offset))


def keyword(call: ast.Call, name: str) -> ast.expr | None:
    """A keyword argument's value node, if given."""
    return next((kw.value for kw in call.keywords if kw.arg == name), None)


def find_class(tree: ast.AST, name: str) -> ast.ClassDef | None:
    """A class definition by name anywhere in a tree."""
    return next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name), None)


def find_function(tree: ast.AST, name: str) -> ast.FunctionDef | None:
    """A function or method definition by name anywhere in a tree (the first one)."""
    return next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name), None)


def assigned(tree: ast.AST, target: str) -> Iterator[ast.expr]:
    """The values assigned (`=` or annotated) to a target spelled like `self.side_channel_port`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if any(ast.unparse(t) == target for t in targets):
            yield value


def guarded(body: list[ast.stmt], tests: tuple[ast.expr, ...] = ()) -> Iterator[tuple[ast.AST, tuple]]:
    """Every node under a statement list with the `if` tests that must hold to reach it (an `else`
    branch's test is wrapped as `not (...)`)."""
    for stmt in body:
        if isinstance(stmt, ast.If):
            yield stmt.test, tests
            yield from guarded(stmt.body, (*tests, stmt.test))
            negated = ast.UnaryOp(op=ast.Not(), operand=stmt.test)
            yield from guarded(stmt.orelse, (*tests, negated))
        elif isinstance(stmt, ast.For | ast.While | ast.With | ast.Try):
            yield stmt, tests
            for part in ("body", "orelse", "finalbody"):
                yield from guarded(getattr(stmt, part, []) or [], tests)
            for handler in getattr(stmt, "handlers", []):
                yield from guarded(handler.body, tests)
        else:
            for node in ast.walk(stmt):
                yield node, tests

"""The `vllm serve` option set of one release, read from its sources as `make_arg_parser` builds it.

`make_arg_parser` adds a few options itself, then `FrontendArgs.add_cli_args` (one `--field-name` per
dataclass field) and `AsyncEngineArgs.add_cli_args` (`EngineArgs.add_cli_args`: `add_argument("--x",
**model_kwargs["x"])` over `get_kwargs(ModelConfig)` and its siblings). What `get_kwargs` makes of a
field is decided by its annotation, in `_compute_kwargs`'s order: a dataclass is one JSON value,
`bool | str | None` an optional value (0.33), `bool` a switch with `--no-x`, `Literal` one value,
`tuple`/`list`/`set` a list; explicit `action=`/`nargs=` and `kwargs["x"]["nargs"]` edits win.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

from pdfleet.model.vllm_releases import ServeFlag, ServeFlagGroup, ServeFlags
from tools.vllm_ast import NotConstant, Sources, call_name, const, find_class, find_function
from tools.vllm_types import aliases, hints, literals, typing_of

ARG_UTILS = "vllm/engine/arg_utils.py"
FRONTENDS = ("vllm/entrypoints/common/cli_args.py", "vllm/entrypoints/openai/cli_args.py")
PARSERS = ("vllm/utils/argparse_utils.py", "vllm/utils/__init__.py")
SWITCH_ACTIONS = ("store_true", "store_false", "store_const", "count")
BOOL_ACTIONS = ("BooleanOptionalAction", "argparse.BooleanOptionalAction")
CLASS_DIRS = ("vllm/config/", "vllm/entrypoints/", "vllm/engine/", "vllm/v1/")

Origin = tuple[str, str]  # (config class, field) a kwargs dict was made for


@dataclass
class _Rules:
    """What this release's `_compute_kwargs` and parser do, read from their source."""

    optional_valued: bool  # `bool | str | None` becomes an optional value
    inverse_prefixes: dict[str, str]  # EnableDisableAction's pairs (0.33); empty before


class _Classes:
    """Class definitions of the release by name (config dataclasses, frontend args), with their files."""

    def __init__(self, src: Sources) -> None:
        self.src = src
        self.by_name: dict[str, tuple[str, ast.ClassDef]] = {}
        for path in sorted(src.files):
            if path.startswith(CLASS_DIRS):
                for node in src.tree(path).body:
                    if isinstance(node, ast.ClassDef):
                        self.by_name.setdefault(node.name, (path, node))

    def fields(self, name: str) -> list[tuple[str, ast.expr, str]]:
        """(field, annotation, file) of a dataclass, base classes' fields first (dataclass order)."""
        if name not in self.by_name:
            raise KeyError(f"vLLM {self.src.version}: no class {name} under {', '.join(CLASS_DIRS)}")
        path, cls = self.by_name[name]
        out: list[tuple[str, ast.expr, str]] = []
        for base in cls.bases:
            if isinstance(base, ast.Name) and base.id in self.by_name:
                out += self.fields(base.id)
        for stmt in cls.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            name = stmt.target.id
            if "ClassVar" not in ast.unparse(stmt.annotation) and not name.startswith("_"):
                out = [f for f in out if f[0] != name] + [(name, stmt.annotation, path)]
        return out

    def annotation(self, origin: Origin) -> tuple[ast.expr, str]:
        """The annotation of one field and the file it is written in."""
        for name, annotation, path in self.fields(origin[0]):
            if name == origin[1]:
                return annotation, path
        raise KeyError(f"vLLM {self.src.version}: {origin[0]} has no field {origin[1]}")

    def is_dataclass(self, name: str) -> bool:
        """A class vLLM decorates as a config/dataclass (get_kwargs parses it from JSON)."""
        found = self.by_name.get(name)
        return found is not None and any(
            ast.unparse(d).split("(")[0].rsplit(".", 1)[-1] in ("config", "dataclass")
            for d in found[1].decorator_list
        )


def _nargs(hints: set[str], classes: _Classes, rules: _Rules) -> str:
    """What `_compute_kwargs` makes of a field's kinds: "0" switch, "1" value, "?" optional, a list."""
    if any(classes.is_dataclass(h) for h in hints):
        return "1"
    if rules.optional_valued and hints == {"bool", "str", "None"}:
        return "?"
    if "bool" in hints:
        return "0"
    if "Literal" in hints:
        return "1"
    for kind in ("tuple", "list", "set"):
        for h in hints:
            if h == kind or h.startswith(kind + ":"):
                return h.split(":", 1)[1] if ":" in h else "+"
    return "1"


class _Reader:
    """Reads the add_argument calls of parser-building functions into ServeFlags."""

    def __init__(self, src: Sources, rules: _Rules) -> None:
        self.src, self.rules = src, rules
        self.classes = _Classes(src)

    def flag(
        self,
        names: list[str],
        kwargs: dict[str, ast.expr],
        origin: Origin | None,
        edits: dict[Origin, dict[str, ast.expr | None]],
    ) -> ServeFlag:
        """One option from its names, its explicit keywords and the field its kwargs came from."""
        nargs, action = "1", None
        kinds: set[str] = set()
        values: list[object] = []
        if origin is not None:
            annotation, path = self.classes.annotation(origin)
            known = aliases(self.src.tree(path))
            kinds = set(hints(annotation, known))
            values = literals(annotation, known) if "Literal" in kinds else []
            nargs = _nargs(kinds, self.classes, self.rules)
            action = "BooleanOptionalAction" if nargs == "0" else None
            for key, value in edits.get(origin, {}).items():
                if value is not None:  # a deleted key (None) reads as an absent one below
                    kwargs.setdefault(key, value)
            if "nargs" in edits.get(origin, {}) and edits[origin]["nargs"] is None and nargs not in "01?":
                nargs = "1"  # `del kwargs[x]["nargs"]`: one (JSON) value
        if kwargs.get("action") is not None:
            action = ast.unparse(kwargs["action"]).strip("'\"")
            if action in SWITCH_ACTIONS:
                nargs = "0"
            elif action in BOOL_ACTIONS:
                nargs, action = "0", "BooleanOptionalAction"
            elif action == "append" and nargs == "0":
                nargs = "1"
        if kwargs.get("nargs") is not None:
            nargs = str(const(kwargs["nargs"]))
        negatives: list[str] = []
        if action == "BooleanOptionalAction":
            negatives = [f"--no-{n[2:]}" for n in names if n.startswith("--")]
            negatives += [
                inverse + n.removeprefix(prefix)
                for n in names
                for prefix, inverse in self.rules.inverse_prefixes.items()
                if n.startswith(prefix)
            ]
        types, choices = typing_of(kwargs, kinds, values)
        return ServeFlag(tuple(names + negatives), nargs, tuple(negatives), types, choices)

    def function(self, func: ast.FunctionDef) -> list[ServeFlag]:
        """The options one function registers, in source order (literal `for` loops unrolled)."""
        origins = _kwargs_origins(func)
        edits = _kwargs_edits(func, origins)
        out = []
        for call, scope in _add_argument_calls(func.body, {}):
            names = [v for a in call.args if isinstance(v := _value(a, scope), str)]
            if not names or not all(n.startswith("-") for n in names):
                continue  # the positional model_tag
            kwargs: dict[str, ast.expr] = {}
            origin = None
            for kw in call.keywords:
                if kw.arg is not None:
                    loop = scope.get(kw.value.id) if isinstance(kw.value, ast.Name) else None
                    kwargs[kw.arg] = loop if isinstance(loop, ast.expr) else kw.value
                else:
                    origin, merged = _splat(kw.value, origins)
                    kwargs.update(merged)
            out.append(self.flag(names, kwargs, origin, edits))
        return out

    def dataclass_args(self, cls_name: str, func: ast.FunctionDef) -> list[ServeFlag]:
        """`add_cli_args` of a frontend dataclass: `--field-name` for every field."""
        edits: dict[Origin, dict[str, ast.expr | None]] = {}
        for helper in _methods(self.classes, cls_name, "_customize_cli_kwargs"):
            for origin, keys in _kwargs_edits(helper, {}, cls_name).items():
                edits.setdefault(origin, {}).update(keys)
        for origin, keys in _kwargs_edits(func, _kwargs_origins(func), cls_name).items():
            edits.setdefault(origin, {}).update(keys)
        return [
            self.flag([f"--{name.replace('_', '-')}"], {}, (cls_name, name), edits)
            for name, _, _ in self.classes.fields(cls_name)
        ]


def _methods(classes: _Classes, cls_name: str, method: str) -> list[ast.FunctionDef]:
    """A method as the class and its bases define it, the class's own first."""
    out = []
    name: str | None = cls_name
    while name in classes.by_name:
        cls = classes.by_name[name][1]
        out += [f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == method]
        name = next((b.id for b in cls.bases if isinstance(b, ast.Name)), None)
    return out


def _method(classes: _Classes, cls_name: str, method: str) -> ast.FunctionDef | None:
    """The method a class resolves to (its own, else the nearest base's)."""
    return next(iter(_methods(classes, cls_name, method)), None)


def _value(node: ast.expr, scope: dict[str, object]) -> object:
    """A constant, or a loop variable bound to one."""
    if isinstance(node, ast.Name) and node.id in scope:
        return scope[node.id]
    return node.value if isinstance(node, ast.Constant) else None


def _add_argument_calls(body: list[ast.stmt], scope: dict[str, object]) -> Iterator[tuple[ast.Call, dict]]:
    """Every `.add_argument(...)` call under the statements, `for a, b in [(...), ...]` unrolled."""
    for stmt in body:
        if isinstance(stmt, ast.For) and isinstance(stmt.iter, ast.List | ast.Tuple):
            for item in stmt.iter.elts:
                bound = dict(scope)
                targets = stmt.target.elts if isinstance(stmt.target, ast.Tuple) else [stmt.target]
                values = item.elts if isinstance(item, ast.Tuple) and len(targets) > 1 else [item]
                for target, value in zip(targets, values, strict=False):
                    if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
                        bound[target.id] = value.value
                    elif isinstance(target, ast.Name):  # `type=type` over `("--x", bool)`: the node
                        bound[target.id] = value
                yield from _add_argument_calls(stmt.body, bound)
            continue
        found = [n for n in ast.walk(stmt) if isinstance(n, ast.Call) and call_name(n) == "add_argument"]
        for call in sorted(found, key=lambda n: (n.lineno, n.col_offset)):
            yield call, scope


def _kwargs_origins(func: ast.FunctionDef) -> dict[str, Origin | str]:
    """Local names bound to `get_kwargs(Cls)` (a class) or `get_kwargs(Cls)["field"]` (one field)."""
    out: dict[str, Origin | str] = {}
    for node in ast.walk(func):
        if not (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)):
            continue
        value = node.value
        call = value.value if isinstance(value, ast.Subscript) else value
        if not isinstance(call, ast.Call) or call_name(call) != "get_kwargs" or not call.args:
            continue
        if isinstance(value, ast.Subscript):
            out[node.targets[0].id] = (ast.unparse(call.args[0]), str(const(value.slice)))
        else:
            out[node.targets[0].id] = ast.unparse(call.args[0])
    return out


def _origin(
    node: ast.expr, origins: dict[str, Origin | str], default_cls: str | None = None
) -> Origin | None:
    """The (class, field) of `X["field"]` where X came from get_kwargs (or is the class's own dict)."""
    found = origins.get(node.id) if isinstance(node, ast.Name) else None
    if isinstance(found, tuple):
        return found
    if (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Name)
        and isinstance(node.slice, ast.Constant)
    ):
        cls = origins.get(node.value.id, default_cls)
        cls = default_cls if cls == "cls" else cls  # `get_kwargs(cls)` in a classmethod (0.33)
        if isinstance(cls, str):
            return cls, str(node.slice.value)
    return None


def _splat(node: ast.expr, origins: dict[str, Origin | str]) -> tuple[Origin | None, dict[str, ast.expr]]:
    """`**model_kwargs["x"]` or `**{**model_kwargs["x"], "deprecated": True}`: the field and the
    explicit keys merged over it."""
    if isinstance(node, ast.Dict):
        origin, merged = None, {}
        for key, value in zip(node.keys, node.values, strict=True):
            if key is None:
                origin, inner = _splat(value, origins)
                merged.update(inner)
            elif isinstance(key, ast.Constant):
                merged[str(key.value)] = value
        return origin, merged
    return _origin(node, origins), {}


def _kwargs_edits(
    func: ast.FunctionDef, origins: dict[str, Origin | str], default_cls: str | None = None
) -> dict[Origin, dict[str, ast.expr | None]]:
    """`kw["x"]["action"] = ...` and `del kw["x"]["nargs"]` in a function: per field, the keys set
    (None for a deleted key)."""
    out: dict[Origin, dict[str, ast.expr | None]] = {}
    for node in ast.walk(func):
        targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else []
        for target in targets:
            if isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant):
                origin = _origin(target.value, origins, default_cls)
                if origin is not None:
                    value = node.value if isinstance(node, ast.Assign) else None
                    out.setdefault(origin, {})[str(target.slice.value)] = value
    return out


def _rules(src: Sources) -> tuple[_Rules, bool, str]:
    """The release's get_kwargs rules, its parser's allow_abbrev and the file the parser is defined in."""
    compute = find_function(src.tree(ARG_UTILS), "_compute_kwargs")
    optional = compute is not None and "{bool, str, type(None)}" in ast.unparse(compute)
    path, parser = next(
        (p, found)
        for p in PARSERS
        if src.has(p) and (found := find_class(src.tree(p), "FlexibleArgumentParser")) is not None
    )
    abbrev = True  # argparse's default, unless the parser passes allow_abbrev=False
    for node in ast.walk(parser):
        if isinstance(node, ast.keyword) and node.arg == "allow_abbrev":
            abbrev = bool(const(node.value))
    inverses: dict[str, str] = {}
    registered = [n for n in ast.walk(parser) if isinstance(n, ast.Call) and call_name(n) == "register"]
    for call in registered:
        if len(call.args) == 3 and ast.unparse(call.args[1]).endswith("BooleanOptionalAction"):
            action = find_class(src.tree(path), ast.unparse(call.args[2]))
            for stmt in action.body if action else []:
                if isinstance(stmt, ast.AnnAssign | ast.Assign) and "_inverse_prefixes" in ast.unparse(stmt):
                    table = const(stmt.value) if stmt.value is not None else None
                    if not isinstance(table, dict):
                        raise NotConstant(f"{path}: {ast.unparse(stmt)} is not a table")
                    inverses = {str(k): str(v) for k, v in table.items()}
    return _Rules(optional, inverses), abbrev, path


def serve_flags(src: Sources) -> ServeFlags:
    """Every option of `vllm serve`: make_arg_parser's own, FrontendArgs', then the engine's."""
    rules, abbrev, parser_path = _rules(src)
    reader = _Reader(src, rules)
    frontend = next((p for p in FRONTENDS if src.has(p)), None)
    if frontend is None:
        raise KeyError(f"vLLM {src.version} has none of {', '.join(FRONTENDS)}")
    tree = src.tree(frontend)
    make = find_function(tree, "make_arg_parser")
    add_front = _method(reader.classes, "FrontendArgs", "add_cli_args")
    if make is None or add_front is None:
        raise KeyError(f"{frontend}: no make_arg_parser or FrontendArgs.add_cli_args")
    engine = [
        find_function(find_class(src.tree(ARG_UTILS), cls) or ast.Module([], []), "add_cli_args")
        for cls in ("EngineArgs", "AsyncEngineArgs")
    ]
    engine_flags = [f for func in engine if func is not None for f in reader.function(func)]
    front_flags = reader.function(make) + reader.dataclass_args("FrontendArgs", add_front)
    groups = (
        ServeFlagGroup(tuple(front_flags), frontend),
        ServeFlagGroup(tuple(engine_flags), ARG_UTILS),
    )
    return ServeFlags(groups, abbrev, parser_path)

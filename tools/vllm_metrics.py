"""vLLM's Prometheus metrics as registered in its source: `self._gauge_cls(name="vllm:...", ...)` calls in
the stat logger (v1/metrics/loggers.py) and the NIXL and Mooncake connectors' stats, with what each
connector counter adds up (`counting_rules`). Speculative-decoding metrics are not tabled (pdfleet
renders no speculative decoding; 0.33 builds their names from a list of tuples).

The `cache_config_info` gauge (`log_metrics_info`) is named by a local and labelled with
`metrics_info.keys()`: its labels are read off CacheConfig (what its `metrics_info()`, `self.__dict__`,
holds: the fields, then attributes its methods set) and `engine`. `finished_reason` carries one series per
`FinishReason` from the start, the strings of FINISH_REASON_STRINGS.

Every other `vllm:` family is tabled by name and file (`other_metrics`): a name is declared where a string
that is exactly `vllm:<name>` is bound to a name or attribute, passed to a call, or is a dict key or a
tuple's item (registration calls, 0.33's name constants and metadata dicts, spec decoding's name lists);
a name compared against (`metric.name == "vllm:..."`) or a prefix (`line.startswith("vllm:spec_decode")`)
declares nothing, nor do docstrings and comments (PromQL in them).

Bucket lists are evaluated from the tree in the order the function builds them (a list bound to
`buckets` and re-bound later, `buckets[1:]`, `[2 ** (10 + i) for i in range(1, 25, 2)]`, 0.33's
`histogram_buckets("family")` families of v1/metrics/buckets.py); bounds that depend on the model
(`build_1_2_5_buckets(max_model_len)`) are kept as that rule.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass

from pdfleet.model.vllm_metric_rows import Metric, OtherMetrics
from tools.vllm_ast import (
    NotConstant,
    Sources,
    assigned,
    call_name,
    const,
    find_class,
    find_function,
    guarded,
    keyword,
)

LOGGERS = "vllm/v1/metrics/loggers.py"
BUCKETS = "vllm/v1/metrics/buckets.py"
ENGINE = "vllm/v1/engine/__init__.py"  # FinishReason and FINISH_REASON_STRINGS
# info gauges: the config class whose metrics_info() (its __dict__) labels them
INFO_CONFIGS = {"vllm:cache_config_info": ("vllm/config/cache.py", "CacheConfig")}
KINDS = {
    "_gauge_cls": "gauge",
    "Gauge": "gauge",
    "_counter_cls": "counter",
    "Counter": "counter",
    "_histogram_cls": "histogram",
    "Histogram": "histogram",
}


@dataclass(frozen=True)
class Rule:
    """Bucket bounds computed at start-up from the model (kept as the expression that computes them)."""

    text: str


def base_labels(src: Sources) -> list[str]:
    """The labels every engine metric carries: the stat logger's first `labelnames = [...]`."""
    value = const(next(assigned(src.tree(LOGGERS), "labelnames")))
    if not isinstance(value, list | tuple):
        raise NotConstant(f"{LOGGERS}: labelnames = {value!r}, not a list")
    return [str(v) for v in value]


def _families(src: Sources) -> dict[str, object]:
    """0.33's bucket families: family key -> default bounds (or the rule for model-dependent ones)."""
    if not src.has(BUCKETS):
        return {}
    tree = src.tree(BUCKETS)
    module: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0]
            if isinstance(target, ast.Name) and node.value is not None:
                try:
                    module[target.id] = const(node.value, module)
                except NotConstant:
                    continue
    static = module.get("_STATIC_FAMILY_DEFAULTS", {})
    families: dict[str, object] = dict(static) if isinstance(static, dict) else {}
    chooser = find_function(tree, "histogram_buckets")
    for arm in ast.walk(chooser) if chooser else ():
        if isinstance(arm, ast.If) and isinstance(arm.test, ast.Compare):
            family = arm.test.comparators[0]
            returned = next((r.value for r in ast.walk(arm) if isinstance(r, ast.Return) and r.value), None)
            if isinstance(family, ast.Constant) and returned is not None:
                families[str(family.value)] = Rule(ast.unparse(returned))
    return families


def _value(node: ast.expr, scope: dict[str, object], families: dict[str, object]) -> object:
    """A bucket or label expression: a constant, a scope name, a bucket family, or a Rule."""
    if isinstance(node, ast.Name) and node.id in scope:
        return scope[node.id]
    first = node.args[0] if isinstance(node, ast.Call) and node.args else None
    if call_name(node) == "histogram_buckets" and isinstance(first, ast.Constant):
        return families.get(str(first.value), Rule(ast.unparse(node)))
    if call_name(node) in ("build_1_2_5_buckets", "build_buckets", "build_cudagraph_buckets"):
        return Rule(ast.unparse(node))
    try:
        return const(node, {k: v for k, v in scope.items() if not isinstance(v, Rule)})
    except NotConstant:
        return Rule(ast.unparse(node))


def _labels(node: ast.expr | None, scope: dict[str, object], families: dict[str, object]) -> tuple[str, ...]:
    """Label names: lists, `labelnames + ["reason"]`; an element that is not constant is kept as text."""
    if node is None:
        return ()
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _labels(node.left, scope, families) + _labels(node.right, scope, families)
    if isinstance(node, ast.List | ast.Tuple):
        return tuple(
            str(_value(e, scope, families)) if isinstance(e, ast.Constant) else ast.unparse(e)
            for e in node.elts
        )
    value = _value(node, scope, families)
    return tuple(str(v) for v in value) if isinstance(value, list) else (ast.unparse(node),)


def _bounds(value: object) -> tuple[float, ...] | None:
    """Constant bucket bounds as written (a list or tuple of numbers); None for a Rule or no buckets."""
    if not isinstance(value, list | tuple):
        return None
    bounds = tuple(b for b in value if isinstance(b, int | float))
    if len(bounds) != len(value):
        raise NotConstant(f"bucket bounds {value!r} are not all numbers")
    return bounds


def _module_constants(tree: ast.Module) -> dict[str, object]:
    """Module-level names bound to constant values (MooncakeConnector's `_XFER_TIME_BUCKETS = (...)`)."""
    found: dict[str, object] = {}
    for node in tree.body:
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target = node.targets[0]
        if isinstance(target, ast.Name):
            try:
                found[target.id] = const(node.value, found)
            except NotConstant:
                continue
    return found


def _function_metrics(
    func: ast.FunctionDef,
    path: str,
    labels: list[str],
    families: dict[str, object],
    module: dict[str, object],
) -> list[Metric]:
    """Metrics one function registers, with the `if` conditions around each."""
    scope: dict[str, object] = {**module, "labelnames": labels}
    found = []
    for node, tests in guarded(func.body):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            scope[node.targets[0].id] = _value(node.value, scope, families)
            continue
        kind = KINDS.get(call_name(node) or "")
        if kind is None or not isinstance(node, ast.Call):
            continue
        name_node = keyword(node, "name")
        name = _name(name_node, scope)
        if name is None:
            continue
        bucket_node = keyword(node, "buckets")
        buckets = _value(bucket_node, scope, families) if bucket_node is not None else None
        found.append(
            Metric(
                name=name,
                kind=kind,
                labels=_labels(keyword(node, "labelnames"), scope, families),
                buckets=_bounds(buckets),
                buckets_rule=buckets.text if isinstance(buckets, Rule) else None,
                when=" and ".join(ast.unparse(t) for t in tests) or None,
                source=path,
            )
        )
    return found


def _name(node: ast.expr | None, scope: dict[str, object]) -> str | None:
    """A registered `vllm:` name: a constant, or a local bound to one (`name = "vllm:cache_config_info"`)."""
    if isinstance(node, ast.Name):
        value = scope.get(node.id)
    elif isinstance(node, ast.Constant):
        value = node.value
    else:
        return None
    return value if isinstance(value, str) and value.startswith("vllm:") else None


def finish_reasons(src: Sources) -> tuple[str, ...]:
    """FINISH_REASON_STRINGS: the finished_reason values, one per FinishReason (`str(reason)`)."""
    value = const(next(assigned(src.tree(ENGINE), "FINISH_REASON_STRINGS")))
    if not isinstance(value, list | tuple):
        raise NotConstant(f"{ENGINE}: FINISH_REASON_STRINGS = {value!r}, not a tuple")
    return tuple(str(v) for v in value)


def info_labels(src: Sources, path: str, class_name: str) -> tuple[str, ...]:
    """An info gauge's labels: the config class's instance attributes as its `__dict__` orders them (its
    fields, ClassVars left out, then `self.x = ...` set by its methods), and `engine`."""
    cls = find_class(src.tree(path), class_name)
    if cls is None:
        raise NotConstant(f"{path}: no class {class_name}")
    names = [
        n.target.id
        for n in cls.body
        if isinstance(n, ast.AnnAssign)
        and isinstance(n.target, ast.Name)
        and "ClassVar" not in ast.unparse(n)
    ]
    for node in ast.walk(cls):
        for target in node.targets if isinstance(node, ast.Assign) else ():
            attr = ast.unparse(target)
            if attr.startswith("self.") and attr[5:].isidentifier() and attr[5:] not in names:
                names.append(attr[5:])
    return (*names, "engine")


def _completed(metric: Metric, src: Sources) -> Metric:
    """A metric with what its registration leaves to other files: an info gauge's labels, and the
    finished_reason values set on every start."""
    if metric.name in INFO_CONFIGS:
        metric = dataclasses.replace(metric, labels=info_labels(src, *INFO_CONFIGS[metric.name]))
    if "finished_reason" in metric.labels and src.has(ENGINE):
        metric = dataclasses.replace(metric, label_values=(("finished_reason", finish_reasons(src)),))
    return metric


def metric_files(src: Sources, nixl_files: Sequence[str], mooncake_files: Sequence[str] = ()) -> list[str]:
    """The stat logger and the connector files that register `vllm:nixl_*` and `vllm:mooncake_*`."""
    nixl = [p for p in nixl_files if '"vllm:nixl_' in src.files[p]]
    return [LOGGERS] + nixl + [p for p in mooncake_files if '"vllm:mooncake_' in src.files[p]]


def metrics(
    src: Sources, nixl_files: Sequence[str], mooncake_files: Sequence[str] = ()
) -> tuple[Metric, ...]:
    """Every `vllm:` metric the release registers in those files, sorted by name then condition; a
    connector counter carries the stats keys its `observe` adds up."""
    labels = base_labels(src)
    families = _families(src)
    found: dict[tuple[str, str | None], Metric] = {}
    for path in metric_files(src, nixl_files, mooncake_files):
        tree = src.tree(path)
        module = _module_constants(tree)
        counted = counting_rules(tree)
        for func in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
            for metric in _function_metrics(func, path, labels, families, module):
                keys = counted.get(metric.name.removeprefix("vllm:"), ())
                complete = _completed(dataclasses.replace(metric, counts=keys), src)
                found.setdefault((metric.name, metric.when), complete)
    return tuple(sorted(found.values(), key=lambda m: (m.name, m.when or "")))


def counting_rules(tree: ast.Module) -> dict[str, tuple[str, ...]]:
    """What each connector counter adds up, from its `observe`: `zip([self.counter_x, ...], [keys, ...])`
    (0.11/0.33 NIXL; a key or a tuple of keys) or `for metric, key in ((self.counter_x, "key"), ...)`
    (0.33 Mooncake). Keyed by the metric's name without `vllm:` (`counter_nixl_x` registers `vllm:nixl_x`)."""
    out: dict[str, tuple[str, ...]] = {}
    for func in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "observe"):
        pairs: list[tuple[ast.expr, ast.expr]] = []
        for loop in (n for n in ast.walk(func) if isinstance(n, ast.For)):
            it = loop.iter
            if call_name(it) == "zip" and isinstance(it, ast.Call) and len(it.args) == 2:
                left, right = it.args
                if isinstance(left, ast.List | ast.Tuple) and isinstance(right, ast.List | ast.Tuple):
                    pairs += list(zip(left.elts, right.elts, strict=False))
            elif isinstance(it, ast.Tuple | ast.List):
                pairs += [
                    (e.elts[0], e.elts[1]) for e in it.elts if isinstance(e, ast.Tuple) and len(e.elts) == 2
                ]
        for attr, keys in pairs:
            name = ast.unparse(attr).removeprefix("self.")
            if not name.startswith("counter_"):
                continue
            value = const(keys) if isinstance(keys, ast.Constant | ast.Tuple | ast.List) else None
            items = value if isinstance(value, list) else [value]
            out[name.removeprefix("counter_")] = tuple(str(v) for v in items if isinstance(v, str))
    return out


NAME = re.compile(r"vllm:[a-z0-9_]+")
NOT_DECLARING = ("startswith", "endswith")  # a prefix or suffix tested, not a metric named


def declared_names(tree: ast.Module) -> set[str]:
    """The `vllm:` metric names a module declares (see the module's docstring for what declares one)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        # a docstring (a bare string statement), a comparison, an f-string's pieces, a prefix test
        if isinstance(node, ast.Expr | ast.Compare | ast.JoinedStr) or call_name(node) in NOT_DECLARING:
            continue
        for child in ast.iter_child_nodes(node):
            value = child.value if isinstance(child, ast.Constant) else None
            if isinstance(value, str) and NAME.fullmatch(value):
                found.add(value)
    return found


def other_metrics(src: Sources, tabled: Sequence[Metric]) -> tuple[OtherMetrics, ...]:
    """Per file (sorted), the `vllm:` names it declares that no `metrics` row holds; a file none of whose
    names is left out is not listed."""
    known = {m.name for m in tabled}
    out = []
    for path in sorted(p for p, text in src.files.items() if "vllm:" in text):
        names = declared_names(src.tree(path)) - known
        if names:
            out.append(OtherMetrics(tuple(sorted(names)), path))
    return tuple(out)

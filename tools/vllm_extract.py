"""The facts of `pdfleet.model.vllm_releases` read from one release's sources, one function per row
(the connector rows are in `vllm_connectors`, the metrics in `vllm_metrics`).

Each function reads the syntax tree of the files that define the fact (factory registrations, the
`KVTransferConfig` dataclass, `envs.environment_variables`, `EngineArgs` defaults, metric
registrations) and says which file it read. Where a fact is spread over a connector package
(0.33's `nixl/`), the connector's own module or package is found from the factory registration.
"""

from __future__ import annotations

import ast

from pdfleet.model.vllm_releases import (
    BatchDefaults,
    BatchTier,
    ChunkedPrefill,
    ConfigField,
    Connector,
    Envs,
    EnvVar,
    KVTransferConfigFacts,
    PrefixCaching,
    Registry,
    Release,
    Scalar,
)
from tools import vllm_metrics
from tools.vllm_ast import (
    NotConstant,
    Sources,
    assigned,
    call_name,
    calls,
    const,
    const_int,
    const_or_text,
    find_class,
    guarded,
    keyword,
)
from tools.vllm_connectors import (
    NIXL,
    buffer_devices,
    extra_config,
    handshake,
    kv_transfer_params,
    lease,
    mooncake_protocol,
    side_channel,
    transfer_log,
)
from tools.vllm_flags import serve_flags

KV = "vllm/distributed/kv_transfer/kv_connector"
FACTORY = f"{KV}/factory.py"
KV_CONFIG = "vllm/config/kv_transfer.py"
CONFIG_UTILS = "vllm/config/utils.py"
ENVS = "vllm/envs.py"
ARG_UTILS = "vllm/engine/arg_utils.py"
STATS = "vllm/v1/metrics/stats.py"
MOONCAKE = "MooncakeConnector"
# env vars of the KV-transfer path: NIXL's and Mooncake's own, and the KV layout NIXL forces
ENV_MARKERS = ("NIXL", "MOONCAKE")
EXTRA_ENVS = ("VLLM_KV_CACHE_LAYOUT",)


def registry(src: Sources) -> Registry:
    """`KVConnectorFactory.register_connector(name, module, class)` calls in factory.py."""
    found = [
        Connector(str(const(c.args[0])), str(const(c.args[1])))
        for c in calls(src.tree(FACTORY), "register_connector")
        if len(c.args) >= 2 and isinstance(c.args[0], ast.Constant)
    ]
    return Registry(tuple(found), FACTORY)


def connector_files(src: Sources, reg: Registry, name: str) -> list[str]:
    """The files of a registered connector: its package, or its module and the folder it shares with
    its helpers when that folder is the connector's own (`v1/mooncake/`)."""
    module = next((c.module for c in reg.connectors if c.name == name), None)
    if module is None:
        return []
    files = src.module_files(module)
    if len(files) == 1 and files[0].rsplit("/", 2)[-2] != "v1":
        return src.module_files(module.rsplit(".", 1)[0])
    return files


def kv_transfer_config(src: Sources) -> KVTransferConfigFacts:
    """The fields of `KVTransferConfig` and the `extra` mode its decorators give pydantic."""
    cls = find_class(src.tree(KV_CONFIG), "KVTransferConfig")
    if cls is None:
        raise KeyError(f"{KV_CONFIG}: no class KVTransferConfig")
    fields = tuple(
        ConfigField(stmt.target.id, ast.unparse(stmt.annotation), ast.unparse(stmt.value or ast.Constant("")))
        for stmt in cls.body
        if isinstance(stmt, ast.AnnAssign)
        and isinstance(stmt.target, ast.Name)
        and "ClassVar" not in ast.unparse(stmt.annotation)
    )
    return KVTransferConfigFacts(fields, _extra_mode(src, cls), KV_CONFIG, _missing_role(cls))


def _missing_role(cls: ast.ClassDef) -> str | None:
    """The literal start of the message `__post_init__` raises for a connector without a role (`if ...
    self.kv_role is None: raise ValueError("Please specify kv_role when ..." f"... {get_args(KVRole)}")`)."""
    for node in ast.walk(cls):
        if not (isinstance(node, ast.If) and "self.kv_role is None" in ast.unparse(node.test)):
            continue
        for raised in ast.walk(node):
            if not (isinstance(raised, ast.Raise) and isinstance(raised.exc, ast.Call) and raised.exc.args):
                continue
            message = raised.exc.args[0]
            parts = message.values if isinstance(message, ast.JoinedStr) else [message]
            words = ""
            for part in parts:
                if not (isinstance(part, ast.Constant) and isinstance(part.value, str)):
                    break
                words += part.value
            return words.strip() or None
    return None


def _extra_mode(src: Sources, cls: ast.ClassDef) -> str:
    """`forbid` when a decorator passes ConfigDict(extra="forbid"), else pydantic's default `ignore`."""
    for decorator in cls.decorator_list:
        name = call_name(decorator) if isinstance(decorator, ast.Call) else ast.unparse(decorator)
        places: list[ast.AST] = [decorator]
        if name == "config" and src.has(CONFIG_UTILS):  # vLLM's own decorator (and its overloads)
            places += [
                n
                for n in ast.walk(src.tree(CONFIG_UTILS))
                if isinstance(n, ast.FunctionDef) and n.name == "config"
            ]
        for dict_call in (c for place in places for c in calls(place, "ConfigDict")):
            extra = keyword(dict_call, "extra")
            if extra is not None:
                return str(const(extra))
    return "ignore"


def envs(src: Sources) -> Envs:
    """Defaults of the KV-transfer env vars in `environment_variables` (typed by the TYPE_CHECKING block)."""
    tree = src.tree(ENVS)
    types = {
        n.target.id: ast.unparse(n.annotation)
        for n in ast.walk(tree)
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }
    table = next(v for v in assigned(tree, "environment_variables") if isinstance(v, ast.Dict))
    out = []
    for key, value in zip(table.keys, table.values, strict=True):
        name = const(key) if isinstance(key, ast.Constant) else None
        if not isinstance(name, str) or not (any(m in name for m in ENV_MARKERS) or name in EXTRA_ENVS):
            continue
        kind = types.get(name) or _converted_to(value) or "str"
        out.append(EnvVar(name, kind, _coerce(_env_default(value, name), kind)))
    return Envs(tuple(sorted(out, key=lambda v: v.name)), ENVS)


def _env_default(value: ast.expr, name: str) -> object:
    """The default of the first call that reads this variable (`os.getenv(name, default)`, ...)."""
    for node in ast.walk(value):
        args = node.args if isinstance(node, ast.Call) else []
        if args and isinstance(args[0], ast.Constant) and args[0].value == name:
            return const_or_text(args[1]) if len(args) > 1 else None
    return None


def _converted_to(value: ast.expr) -> str | None:
    """`int` for `lambda: int(os.getenv(...))`: the type the reader converts to, when it converts."""
    for node in ast.walk(value):
        func = node.func if isinstance(node, ast.Call) else None
        if isinstance(func, ast.Name) and func.id in ("int", "float"):
            return func.id
    return None


def _coerce(raw: object, kind: str) -> Scalar:
    """An env default as its declared type (`"5600"` for an int var is 5600)."""
    if raw is None or isinstance(raw, bool | int | float):
        return raw
    if not isinstance(raw, str):
        raise NotConstant(f"an env default of {raw!r}: not a scalar")
    bare = kind.replace("Optional[", "").rstrip("]")
    if bare.startswith("int"):
        return int(raw)
    if bare.startswith("float"):
        return float(raw)
    if bare.startswith("bool"):
        return raw.lower() in ("1", "true")
    return raw


def chunked_prefill(src: Sources) -> ChunkedPrefill:
    """Whether EngineArgs' default-setting code overrides `enable_chunked_prefill` unconditionally, and
    the warning it gives when the flag turns it off."""
    cls = find_class(src.tree(ARG_UTILS), "EngineArgs")
    forced, warning = False, None
    for func in (n for n in (cls.body if cls else []) if isinstance(n, ast.FunctionDef)):
        if not func.name.startswith("_set_default"):
            continue
        for node, tests in guarded(func.body):
            conditions = " and ".join(ast.unparse(t) for t in tests)
            if (
                isinstance(node, ast.Assign)
                and ast.unparse(node.targets[0]) == "self.enable_chunked_prefill"
                and isinstance(node.value, ast.Constant)
                and node.value.value is True
            ):
                forced = forced or "self.enable_chunked_prefill" not in conditions
            name = call_name(node)
            if (
                name in ("warning", "warning_once")
                and "not self.enable_chunked_prefill" in conditions
                and isinstance(node, ast.Call)
            ):
                warning = warning or str(const_or_text(node.args[0]))
    return ChunkedPrefill(forced, warning, ARG_UTILS)


def prefix_caching(src: Sources) -> PrefixCaching:
    """The value EngineArgs gives `enable_prefix_caching` when it is None (unset), a local name it is
    read from followed one step."""
    cls = find_class(src.tree(ARG_UTILS), "EngineArgs")
    for func in (n for n in (cls.body if cls else []) if isinstance(n, ast.FunctionDef)):
        local = {
            ast.unparse(n.targets[0]): n.value
            for n in ast.walk(func)
            if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)
        }
        for node, tests in guarded(func.body):
            conditions = [ast.unparse(t) for t in tests]
            if (
                isinstance(node, ast.Assign)
                and ast.unparse(node.targets[0]) == "self.enable_prefix_caching"
                and "self.enable_prefix_caching is None" in conditions
            ):
                value = local.get(ast.unparse(node.value), node.value)
                return PrefixCaching(
                    ast.unparse(value), " and ".join(conditions), ARG_UTILS, _preempted_apart(src), STATS
                )
    raise KeyError(f"vLLM {src.version}: {ARG_UTILS} sets no default for enable_prefix_caching")


def _preempted_apart(src: Sources) -> bool:
    """Whether PrefixCacheStats counts a preempted request's lookups in fields of their own."""
    cls = find_class(src.tree(STATS), "PrefixCacheStats")
    if cls is None:
        raise KeyError(f"{STATS}: no class PrefixCacheStats")
    fields = [ast.unparse(n.target) for n in cls.body if isinstance(n, ast.AnnAssign)]
    return "preempted_queries" in fields


def batch_defaults(src: Sources) -> BatchDefaults:
    """The GPU-memory tiers of default max_num_batched_tokens / max_num_seqs (usage context
    OPENAI_API_SERVER, what `vllm serve` runs under) and the rule that caps max_num_seqs."""
    tree = src.tree(ARG_UTILS)
    chain = next(n for n in ast.walk(tree) if isinstance(n, ast.If) and "GiB_bytes" in ast.unparse(n.test))
    tiers = []
    node: ast.If | None = chain
    while node is not None:
        tiers.append(_tier(node.test, node.body))
        nxt = node.orelse
        if len(nxt) == 1 and isinstance(nxt[0], ast.If):
            node = nxt[0]
        else:
            tiers.append(_tier(None, nxt))
            node = None
    rule = next(ast.unparse(v) for v in assigned(tree, "self.max_num_seqs") if call_name(v) == "min")
    return BatchDefaults(tuple(tiers), rule, ARG_UTILS, _mode_factors(tree))


def _mode_factors(tree: ast.Module) -> tuple[tuple[str, int], ...]:
    """`if self.performance_mode == "throughput": ... self.max_num_batched_tokens *= 2` (0.33): each mode
    and what it multiplies the defaulted max_num_batched_tokens and max_num_seqs by (one factor for both;
    a mode scaling them apart is a fact the table cannot hold: KeyError, to review)."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)):
            continue
        if ast.unparse(node.test.left) != "self.performance_mode" or not isinstance(node.test.ops[0], ast.Eq):
            continue
        mode = str(const(node.test.comparators[0]))
        factors = {
            ast.unparse(inner.target): const_int(inner.value)
            for inner in ast.walk(node)
            if isinstance(inner, ast.AugAssign) and isinstance(inner.op, ast.Mult)
        }
        if not factors:
            continue
        scaled = {factors.get("self.max_num_batched_tokens"), factors.get("self.max_num_seqs")}
        if len(scaled) != 1 or None in scaled:
            raise KeyError(f"{ARG_UTILS}: --performance-mode {mode} scales {factors}, not both limits alike")
        found.append((mode, factors["self.max_num_batched_tokens"]))
    return tuple(found)


def _tier(test: ast.expr | None, body: list[ast.stmt]) -> BatchTier:
    """One branch of the device-memory chain: its memory floor, exclusions and server defaults."""
    values = {}
    for target in ("default_max_num_batched_tokens", "default_max_num_seqs"):
        table = next(v for s in body for v in assigned(s, target) if isinstance(v, ast.Dict))
        server = next(
            v
            for k, v in zip(table.keys, table.values, strict=True)
            if k is not None and ast.unparse(k).endswith("OPENAI_API_SERVER")
        )
        values[target] = const_int(server)
    min_gib, excluded = 0, []
    for node in ast.walk(test) if test is not None else ():
        if isinstance(node, ast.BinOp) and ast.unparse(node.right) == "GiB_bytes":
            min_gib = const_int(node.left)
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.NotIn):
            excluded.append(str(const(node.left)))
        elif (
            isinstance(node, ast.UnaryOp)
            and isinstance(node.op, ast.Not)
            and isinstance(node.operand, ast.Name)
        ):
            excluded.append(node.operand.id.removeprefix("is_"))
    return BatchTier(
        min_gib, tuple(excluded), values["default_max_num_batched_tokens"], values["default_max_num_seqs"]
    )


def extract(src: Sources) -> Release:
    """Every fact of one release, from its sources."""
    reg = registry(src)
    nixl = connector_files(src, reg, NIXL)
    mooncake = connector_files(src, reg, MOONCAKE)
    try:
        metrics = vllm_metrics.metrics(src, nixl, mooncake)
    except NotConstant as exc:  # a registration pdfleet cannot read is a fact to review, not to guess
        raise KeyError(f"vLLM {src.version}: unreadable metric definition {exc}") from exc
    return Release(
        version=src.version,
        registry=reg,
        kv_transfer_config=kv_transfer_config(src),
        envs=envs(src),
        side_channel=side_channel(src, nixl),
        buffer_devices=buffer_devices(src, nixl),
        nixl_extra_config=extra_config(src, nixl),
        mooncake_extra_config=extra_config(src, mooncake) if mooncake else None,
        mooncake_protocol=mooncake_protocol(src, mooncake) if mooncake else None,
        kv_transfer_params=kv_transfer_params(src, nixl),
        handshake=handshake(src, nixl),
        lease=lease(src, nixl),
        chunked_prefill=chunked_prefill(src),
        prefix_caching=prefix_caching(src),
        batch_defaults=batch_defaults(src),
        metrics=metrics,
        serve_flags=serve_flags(src),
        other_metrics=vllm_metrics.other_metrics(src, metrics),
        transfer_logs=tuple(
            log
            for log in (
                transfer_log(src, nixl, NIXL),
                transfer_log(src, mooncake, MOONCAKE) if mooncake else None,
            )
            if log is not None
        ),
    )

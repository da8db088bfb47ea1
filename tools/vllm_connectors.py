"""The NIXL and Mooncake connector rows of the vLLM release facts, read from the connector's own files
(0.11's `v1/nixl_connector.py`, 0.33's `v1/nixl/` package, `v1/mooncake/`): side-channel ports, buffer
devices, extra-config keys, the kv_transfer_params protocol, the handshake, the lease and the keys of the
`KV Transfer metrics` log line.
"""

from __future__ import annotations

import ast

from pdfleet.model.vllm_metric_rows import TransferLog
from pdfleet.model.vllm_releases import (
    BufferDevices,
    ExtraConfig,
    ExtraKey,
    Handshake,
    KVTransferParams,
    Lease,
    MooncakeProtocol,
    Scalar,
    SideChannel,
)
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
    find_function,
)

NIXL = "NixlConnector"
KV_UTILS = "vllm/distributed/kv_transfer/kv_connector/utils.py"


def side_channel(src: Sources, files: list[str]) -> SideChannel:
    """The port P advertises and the port the handshake listener binds, from NixlConnector's sources."""
    advertised = listener = None
    where = files[0]
    for path in files:
        tree = src.tree(path)
        if advertised is None:
            value = next(assigned(tree, "self.side_channel_port"), None)
            if value is not None:
                advertised, where = ast.unparse(value), path
        func = find_function(tree, "_nixl_handshake_listener")
        if func is not None and listener is None:
            listener = next((ast.unparse(c.args[2]) for c in calls(func, "make_zmq_path")), None)
    if advertised is None or listener is None:
        raise KeyError(f"vLLM {src.version}: no side_channel_port / handshake listener in {files}")
    return SideChannel(
        advertised, listener, "tensor_parallel_size" in advertised, "tp_rank" in listener, where
    )


def buffer_devices(src: Sources, files: list[str]) -> BufferDevices:
    """`_NIXL_SUPPORTED_DEVICE`, the platform -> kv_buffer_device table NixlConnector checks at start."""
    for path in files:
        value = next(assigned(src.tree(path), "_NIXL_SUPPORTED_DEVICE"), None)
        if value is not None:
            table = const(value)
            if not isinstance(table, dict) or not all(isinstance(v, list | tuple) for v in table.values()):
                raise NotConstant(f"{path}: _NIXL_SUPPORTED_DEVICE = {table!r}, not a table of lists")
            pairs = tuple((str(k), tuple(v)) for k, v in table.items())
            return BufferDevices(pairs, path)
    raise KeyError(f"vLLM {src.version}: no _NIXL_SUPPORTED_DEVICE in {files}")


def extra_config(src: Sources, files: list[str]) -> ExtraConfig:
    """Every `get_from_extra_config(key, default)` / `...extra_config.get(key, default)` in the files."""
    keys: dict[str, Scalar | tuple[Scalar, ...]] = {}
    used: list[str] = []
    for path in files:
        for node in ast.walk(src.tree(path)):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
                continue
            is_getter = node.func.attr == "get_from_extra_config" or (
                node.func.attr == "get" and ast.unparse(node.func.value).endswith("extra_config")
            )
            if not is_getter or not isinstance(node.args[0], ast.Constant):
                continue
            default = const_or_text(node.args[1]) if len(node.args) > 1 else None
            keys.setdefault(str(node.args[0].value), _scalars(default, node))
            if path not in used:
                used.append(path)
    items = tuple(ExtraKey(k, v) for k, v in sorted(keys.items()))
    return ExtraConfig(items, tuple(used))


def _scheduler_class(src: Sources, files: list[str], connector: str) -> tuple[ast.ClassDef, str]:
    """The scheduler-side class of a connector: alias `NixlConnector = NixlPullConnector` followed, then
    the class its `self.connector_scheduler` is built from."""
    trees = {path: src.tree(path) for path in files}
    name = connector
    for tree in trees.values():
        alias = next(assigned(tree, connector), None)
        if isinstance(alias, ast.Name):
            name = alias.id
    for tree in trees.values():
        cls = find_class(tree, name)
        if cls is None:
            continue
        for value in assigned(cls, "self.connector_scheduler"):
            target = call_name(value)
            for path, other in trees.items():
                found = find_class(other, target) if target else None
                if found is not None:
                    return found, path
    raise KeyError(f"vLLM {src.version}: no scheduler class for {connector} in {files}")


def kv_transfer_params(src: Sources, files: list[str]) -> KVTransferParams:
    """What P's `request_finished` returns, the statuses it hands over for, and the keys D reads."""
    cls, path = _scheduler_class(src, files, NIXL)
    func = find_function(cls, "request_finished")
    if func is None:
        raise KeyError(f"{path}: {cls.name} has no request_finished")
    produced: list[str] = []
    for ret in (n for n in ast.walk(func) if isinstance(n, ast.Return) and isinstance(n.value, ast.Tuple)):
        for part in ret.value.elts if isinstance(ret.value, ast.Tuple) else ():
            if isinstance(part, ast.Call) and call_name(part) == "dict":
                produced += [kw.arg for kw in part.keywords if kw.arg]
    statuses = sorted(
        {
            n.attr
            for n in ast.walk(func)
            if isinstance(n, ast.Attribute) and ast.unparse(n.value) == "RequestStatus"
        }
    )
    return KVTransferParams(
        tuple(produced), _params_read(src, files), tuple(statuses), _block_ids_type(src, files), path
    )


def _scalars(value: object, node: ast.AST) -> Scalar | tuple[Scalar, ...]:
    """A default as the table holds it: a scalar, or a list's items as a tuple of scalars."""
    items = value if isinstance(value, list) else [value]
    scalars = tuple(v for v in items if v is None or isinstance(v, str | int | float | bool))
    if len(scalars) != len(items):
        raise NotConstant(f"{ast.unparse(node)}: a default that is not a scalar or a list of them")
    return scalars if isinstance(value, list) else scalars[0]


def _params_read(src: Sources, files: list[str]) -> tuple[str, ...]:
    """Keys read from a request's kv_transfer_params (`params["k"]`, `params.get("k")`) in the files."""
    holders = {"params", "kv_transfer_params", "request.kv_transfer_params"}
    keys: set[str] = set()
    for path in files:
        for node in ast.walk(src.tree(path)):
            if isinstance(node, ast.GeneratorExp | ast.ListComp) and _tests_membership(node, holders):
                checked = node.generators[0].iter
                keys.update(str(e.value) for e in _elements(checked) if isinstance(e, ast.Constant))
            if isinstance(node, ast.Subscript) and ast.unparse(node.value) in holders:
                if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                    keys.add(node.slice.value)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get"
                and ast.unparse(node.func.value) in holders
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                keys.add(node.args[0].value)
    return tuple(sorted(keys))


def _elements(node: ast.expr) -> list[ast.expr]:
    """The items of a tuple literal ([] for anything else)."""
    return node.elts if isinstance(node, ast.Tuple) else []


def _tests_membership(node: ast.GeneratorExp | ast.ListComp, holders: set[str]) -> bool:
    """`all(p in params for p in ("a", "b"))`: a membership test of constant keys against the params."""
    elt, gen = node.elt, node.generators[0]
    return (
        isinstance(elt, ast.Compare)
        and isinstance(elt.ops[0], ast.In)
        and ast.unparse(elt.comparators[0]) in holders
        and isinstance(gen.iter, ast.Tuple)
        and all(isinstance(e, ast.Constant) for e in gen.iter.elts)
    )


def mooncake_protocol(src: Sources, files: list[str]) -> MooncakeProtocol:
    """The kv_transfer_params keys MooncakeConnector reads and its bootstrap server's routes
    (`self.app.post("/register")(...)`)."""
    routes: list[tuple[str, str]] = []
    schemas: list[tuple[str, tuple[tuple[str, str], ...]]] = []
    used = [path for path in files if _params_read(src, [path])]
    for path in files:
        before = len(routes)
        for node in ast.walk(src.tree(path)):
            if not isinstance(node, ast.Call):
                continue
            func, first = node.func, node.args[0] if node.args else None
            if (
                isinstance(func, ast.Attribute)
                and func.attr in ("get", "post", "put", "delete")
                and ast.unparse(func.value).endswith("app")
                and isinstance(first, ast.Constant)
            ):
                routes.append((func.attr.upper(), str(first.value)))
        if len(routes) > before:
            schemas += _payload_classes(src.tree(path))
            used += [path] if path not in used else []
    return MooncakeProtocol(_params_read(src, files), tuple(routes), tuple(schemas), tuple(used))


def _payload_classes(tree: ast.Module) -> list[tuple[str, tuple[tuple[str, str], ...]]]:
    """Pydantic models and dataclasses of a module with their annotated fields, in source order."""
    found = []
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        kinds = [ast.unparse(b) for b in cls.bases] + [ast.unparse(d) for d in cls.decorator_list]
        if "BaseModel" in kinds or "dataclass" in kinds:
            fields = tuple(
                (ast.unparse(s.target), ast.unparse(s.annotation))
                for s in cls.body
                if isinstance(s, ast.AnnAssign)
            )
            found.append((cls.name, fields))
    return found


def _block_ids_type(src: Sources, files: list[str]) -> str:
    """The annotation of `remote_block_ids` (a field or an argument), kv_connector/utils aliases resolved."""
    for path in files:
        for node in ast.walk(src.tree(path)):
            if isinstance(node, ast.AnnAssign) and ast.unparse(node.target) == "remote_block_ids":
                return _resolve_alias(src, ast.unparse(node.annotation))
            if isinstance(node, ast.arg) and node.arg == "remote_block_ids" and node.annotation is not None:
                return _resolve_alias(src, ast.unparse(node.annotation))
    return ""


def _resolve_alias(src: Sources, annotation: str) -> str:
    """`BlockIds` -> its definition in kv_connector/utils.py; other annotations as written."""
    if src.has(KV_UTILS):
        value = next(assigned(src.tree(KV_UTILS), annotation), None)
        if value is not None:
            return ast.unparse(value)
    return annotation


def handshake(src: Sources, files: list[str]) -> Handshake:
    """NIXL_CONNECTOR_VERSION, the compatibility-hash factors and the NIXL version the worker requires."""
    version = factors = minimum = None
    where = files[0]
    for path in files:
        tree = src.tree(path)
        value = next(assigned(tree, "NIXL_CONNECTOR_VERSION"), None)
        if value is not None:
            version, where = const_int(value), path
        for func in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and "compat" in n.name):
            table = next((v for v in assigned(func, "factors") if isinstance(v, ast.Dict)), None)
            if table is not None and factors is None:
                factors = tuple(str(const(k)) for k in table.keys if isinstance(k, ast.Constant))
        check = next(calls(tree, "check_nixl_version"), None)
        if check is not None and check.args:
            minimum = str(const(check.args[0]))
    return Handshake(
        version, factors or (), minimum, where, _receive_timeout(src, files), _reports_load_errors(src, files)
    )


def _receive_timeout(src: Sources, files: list[str]) -> int | None:
    """zmq.RCVTIMEO (ms) set in the function that opens D's handshake query socket (`zmq.REQ`)."""
    for path in files:
        for func in (n for n in ast.walk(src.tree(path)) if isinstance(n, ast.FunctionDef)):
            if "zmq.REQ" not in ast.unparse(func):
                continue
            for call in calls(func, "setsockopt"):
                if len(call.args) == 2 and ast.unparse(call.args[0]) == "zmq.RCVTIMEO":
                    return const_int(call.args[1])
    return None


def _reports_load_errors(src: Sources, files: list[str]) -> bool:
    """Whether the connector defines `get_block_ids_with_load_errors` (the scheduler's way to learn which
    blocks a failed handshake or read left invalid)."""
    return any(
        isinstance(n, ast.FunctionDef) and n.name == "get_block_ids_with_load_errors"
        for path in files
        for n in ast.walk(src.tree(path))
    )


LEASE_NAMES = ("self._kv_lease_duration", "kv_lease_duration")


def lease(src: Sources, files: list[str]) -> Lease:
    """The heartbeat interval and the per-heartbeat extension NixlConnector derives from kv_lease_duration
    (`self._heartbeat_interval = ...`, `self._lease_extension = ...`), written in terms of that key."""
    found: dict[str, str] = {}
    used: list[str] = []
    for path in files:
        for target in ("self._heartbeat_interval", "self._lease_extension"):
            value = next(assigned(src.tree(path), target), None)
            if value is not None and target not in found:
                text = ast.unparse(value)
                for name in LEASE_NAMES:
                    text = text.replace(name, "kv_lease_duration")
                found[target] = text
                used += [path] if path not in used else []
    # no lease: the release holds blocks for a fixed time; the files searched are where that was read
    beat, extension = found.get("self._heartbeat_interval"), found.get("self._lease_extension")
    return Lease(beat, extension, tuple(used or files))


def transfer_log(src: Sources, files: list[str], connector: str) -> TransferLog | None:
    """The keys of the dict the connector's stats class (a `KVConnectorStats`) returns last from `reduce()`,
    the one for an interval with transfers; a `**name` spread is the constant dict bound to that name in
    `reduce` (0.33's failure counts). None: the connector keeps no stats."""
    for path in files:
        for cls in (n for n in ast.walk(src.tree(path)) if isinstance(n, ast.ClassDef)):
            reduce = next(
                (f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "reduce"), None
            )
            if reduce is None or not any(ast.unparse(b).endswith("KVConnectorStats") for b in cls.bases):
                continue
            returned = [
                r.value for r in ast.walk(reduce) if isinstance(r, ast.Return) and r.value is not None
            ]
            last = max((v for v in returned if isinstance(v, ast.Dict)), key=lambda v: v.lineno, default=None)
            if last is not None:
                return TransferLog(connector, _dict_keys(last, reduce), path)
    return None


def _dict_keys(node: ast.Dict, scope: ast.FunctionDef) -> tuple[str, ...]:
    """A dict literal's constant keys in order, a `**name` spread replaced by the keys of the dict literal
    `name` is bound to in `scope`; anything else is a fact the table cannot hold (NotConstant)."""
    keys: list[str] = []
    for key, value in zip(node.keys, node.values, strict=True):
        if key is None and isinstance(value, ast.Name):
            bound = next(assigned(scope, value.id), None)
            if not isinstance(bound, ast.Dict):
                raise NotConstant(f"**{value.id} in {scope.name}() is not a dict literal")
            keys += _dict_keys(bound, scope)
        elif isinstance(key, ast.Constant) and isinstance(key.value, str):
            keys.append(key.value)
        else:
            raise NotConstant(f"{ast.unparse(node)}: a key that is not a string")
    return tuple(keys)

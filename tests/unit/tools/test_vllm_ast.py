"""Constant expressions as vLLM writes them, evaluated from the tree; anything else kept as source text."""

from __future__ import annotations

import ast
import zipfile
from pathlib import Path

import pytest

from tools.vllm_ast import NotConstant, Sources, assigned, const, const_or_text, guarded


def expr(text: str) -> ast.expr:
    return ast.parse(text, mode="eval").body


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("[2 ** (10 + i) for i in range(1, 25, 2)]", [2**e for e in range(11, 34, 2)]),
        ("b[1:]", [2, 3]),
        ("{'cuda': ('cuda', 'cpu'), 'tpu': ('cpu',)}", {"cuda": ["cuda", "cpu"], "tpu": ["cpu"]}),
        ("4096 * 2", 8192),
        ("-1", -1),
    ],
)
def test_constant_expressions(text: str, value: object) -> None:
    assert const(expr(text), {"b": [1, 2, 3]}) == value


def test_anything_else_is_kept_as_text() -> None:
    with pytest.raises(NotConstant):
        const(expr("current_platform.device_type"))
    assert const_or_text(expr("self.decoder_kv_blocks_ttl")) == "self.decoder_kv_blocks_ttl"


def test_assignments_and_their_guards() -> None:
    tree = ast.parse("x: int = 1\nif a:\n    y = 2\nelse:\n    y = 3\n")
    assert [const(v) for v in assigned(tree, "x")] == [1]
    guards = [
        tuple(ast.unparse(t) for t in tests)
        for node, tests in guarded(tree.body)
        if isinstance(node, ast.Assign)
    ]
    assert guards == [("a",), ("not a",)]


def test_a_wheel_is_read_without_unpacking_or_importing(tmp_path: Path) -> None:
    wheel = tmp_path / "vllm-0.0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm/envs.py", "raise SystemExit('imported')\n")
        archive.writestr("vllm/x/__init__.py", "")
        archive.writestr("vllm/x/a.py", "")
        archive.writestr("vllm/x/sub/b.py", "")
        archive.writestr("vllm-0.0.1.dist-info/METADATA", "Name: vllm\n")
    src = Sources.from_wheel(wheel, "0.0.1")
    assert sorted(src.files) == ["vllm/envs.py", "vllm/x/__init__.py", "vllm/x/a.py", "vllm/x/sub/b.py"]
    assert src.module_files("vllm.x") == ["vllm/x/__init__.py", "vllm/x/a.py"]
    assert src.module_files("vllm.envs") == ["vllm/envs.py"]
    assert isinstance(src.tree("vllm/envs.py"), ast.Module)
    with pytest.raises(KeyError, match="vLLM 0.0.1 has no vllm/config/kv_transfer.py"):
        src.tree("vllm/config/kv_transfer.py")

"""Shared pieces of the fleet tests."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def third_party_imports(files: Iterable[Path]) -> set[str]:
    """Top-level names of the non-stdlib, non-pdfleet modules these files import."""
    found: set[str] = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return {name for name in found if name != "pdfleet" and name not in sys.stdlib_module_names}

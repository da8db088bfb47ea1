"""The tree's shape: imports inside pdfleet/ go one way (no cycles, each layer only uses the layers below
it), modules stay small, roles are found without import machinery, and tests mirror the source."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "pdfleet"
MAX_LINES = 450
# Data tables allowed past MAX_LINES, each with the reason (none today).
LONG_MODULES: dict[str, str] = {}
# Lowest first: a module may import its own package and any package of a lower layer, nothing else.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("__init__", "errors"),  # what every side shares
    ("tokens",),  # prompt-token counting, shared by the gateway and the simulator
    ("model",),  # what operators write: profiles, inventories, release facts, the hardware catalog
    ("gateway", "sim"),  # host programs (the host wheel); they see only the layers above
    ("ops", "metrics"),  # the operations engine; reading metrics
    ("hw",),  # hardware facts and decisions
    ("fleet",),  # topology, deployment, the role contract, rendering, provisioning, the host wheel
    ("checks", "bench", "lab"),  # verify, benchmarks, the local lab
    ("cli",),  # the tasks: wire everything, plug the lab in
)
# Test modules that test a package as a whole rather than one module, with what they test.
MIRROR_EXCEPTIONS: dict[str, str] = {
    "cli/test_cli.py": "pdfleet/cli/__init__.py: the task namespace as a whole (--list, --help, bad input)",
    "roles/test_registry.py": "roles/__init__.py: the registry and the Role contract of every role",
    "roles/test_converged.py": "every role's plan on a converged host, from recorded hardware facts",
}
# Folders a clone gets from tools, not from the repo.
IGNORED_FOLDERS = {
    ".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", ".hypothesis", "out", "build", "dist",
}
LAYER_OF = {package: depth for depth, packages in enumerate(LAYERS) for package in packages}


def _modules() -> dict[str, Path]:
    """Dotted name -> file of every module under pdfleet/."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(path: Path) -> Iterator[str]:
    """The pdfleet modules a file imports (anywhere in it: module level, functions, TYPE_CHECKING)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name in MODULES)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "pdfleet":
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                yield sub if sub in MODULES else node.module


GRAPH = {name: sorted(set(_imports(path)) - {name}) for name, path in MODULES.items()}


def _package(module: str) -> str:
    """The top-level part of pdfleet a module belongs to (`fleet` for pdfleet.fleet.topology)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, []):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_inside_pdfleet() -> None:
    assert _cycles(GRAPH) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]


def test_every_package_has_a_layer() -> None:
    packages = {_package(m) for m in MODULES}
    assert packages <= set(LAYER_OF), f"give these a layer: {sorted(packages - set(LAYER_OF))}"


def test_imports_only_go_down_the_layers() -> None:
    wrong = []
    for module, imported in GRAPH.items():
        own = _package(module)
        for target in imported:
            other = _package(target)
            if other != own and LAYER_OF[other] >= LAYER_OF[own]:
                wrong.append(f"{module} -> {target}")
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def _sources() -> list[Path]:
    """Every Python file of the product: the package, the roles, the bench scripts, tasks.py."""
    files = [*PACKAGE.rglob("*.py"), *(REPO / "roles").rglob("*.py"), *(REPO / "bench").rglob("*.py")]
    return sorted([*files, REPO / "tasks.py"])


@pytest.mark.parametrize("path", _sources(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_no_module_is_over_the_line_limit(path: Path) -> None:
    name = path.relative_to(REPO).as_posix()
    lines = len(path.read_text(encoding="utf-8").splitlines())
    if name in LONG_MODULES:
        return
    assert lines <= MAX_LINES, f"{name} has {lines} lines (> {MAX_LINES}): split it along its seams"


def test_no_import_machinery_finds_code_by_path() -> None:
    pattern = re.compile(r"import_module|find_spec|sys\.path")
    hits = [f"{p.relative_to(REPO)}:{n}" for p in _sources()
            for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert not hits, hits


def test_unit_tests_mirror_the_source() -> None:
    """tests/unit/<pkg>/test_<module>.py names a module of pdfleet/<pkg>/ (or roles/), or a whole package."""
    unmatched = []
    for test in sorted((REPO / "tests" / "unit").rglob("test_*.py")):
        rel = test.relative_to(REPO / "tests" / "unit")
        stem = rel.stem.removeprefix("test_")
        folder = rel.parent
        root = REPO / "roles" if folder.parts[:1] == ("roles",) else PACKAGE
        base = root.joinpath(*folder.parts[1:]) if folder.parts[:1] == ("roles",) else root / folder
        candidates = [base / f"{stem}.py", base / stem / "__init__.py", base / stem]
        known = rel.as_posix() in MIRROR_EXCEPTIONS or rel == Path("test_layout.py")
        if not known and not any(c.exists() for c in candidates):
            unmatched.append(str(rel))
    assert not unmatched, f"tests that mirror no module: {unmatched}"


def test_every_test_directory_is_a_package() -> None:
    missing = [str(d.relative_to(REPO)) for d in (REPO / "tests").rglob("*")
               if d.is_dir() and any(d.glob("*.py")) and not (d / "__init__.py").exists()]
    assert not missing, missing


def test_no_test_imports_another_test_module() -> None:
    bad = []
    for test in (REPO / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(test.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                last = node.module.rsplit(".", 1)[-1]
                if last.startswith("test_") or last == "conftest" or node.level:
                    bad.append(f"{test.relative_to(REPO)}: from {'.' * node.level}{node.module}")
    assert not bad, bad


def test_the_architecture_page_names_every_folder_and_package() -> None:
    page = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    folders = [p.name for p in REPO.iterdir()
               if p.is_dir() and p.name not in IGNORED_FOLDERS and not p.name.endswith(".egg-info")]
    packages = [p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()]
    modules = [p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"]
    missing = [n for n in [*folders, *packages, *modules] if f"`{n}" not in page]
    assert not missing, f"docs/architecture.md does not name: {missing}"

"""The host wheel: what runs on hosts (gateway, simulator, rollout controller) with its own version,
built on the control machine.

Host code is the host programs' packages plus every pdfleet module they import, found from the
sources' own import statements, so the set cannot drift from the code. Its version is
`<release>+h<hash of those files and the host requirements>`: an edit to operator code (cli, fleet,
ops, lab, ...) changes nothing a host installs, so provisioning a converged fleet after it restarts
nothing. The wheel is written directly (a pure-Python wheel is a zip with a dist-info), with fixed
timestamps, so the same sources always give the same bytes; no build backend or index is needed.
A site's PyPI mirror does not carry it: provision uploads it to the hosts that run pdfleet code.
"""

from __future__ import annotations

import ast
import base64
import functools
import hashlib
import importlib.metadata
import json
import os
import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pdfleet
from pdfleet.errors import PdfleetError

PACKAGE_DIR = Path(pdfleet.__file__).resolve().parent
DEFAULT_CACHE = Path("~/.cache/pdfleet/wheels")
# The pdfleet imports of each source text host_files has parsed, by the text's SHA-256 (see host_files);
# beside the wheels, written where they are (provision), read by every command
IMPORTS_CACHE_NAME = "host-imports.json"
IMPORTS_CACHE_MAX = 4096  # entries kept across edits; past it, only the current sources' are
DIST_NAME = "pdfleet"
# The programs hosts run: (console script, module:function). Their packages start the import closure.
ENTRY_POINTS: tuple[tuple[str, str], ...] = (
    ("pdfleet-gateway", "pdfleet.gateway.cli:main"),
    ("pdfleet-sim", "pdfleet.sim.cli:main"),
    ("pdfleet-rollout", "pdfleet.rollout.cli:main"),
)
HOST_PACKAGES: tuple[str, ...] = ("gateway", "sim", "rollout")
# Third-party distributions host code imports; their version specifiers are pdfleet's own (pyproject).
HOST_DEPENDENCIES: tuple[str, ...] = ("aiohttp", "uvloop", "prometheus-client", "pyyaml", "pydantic")
HOST_EXTRAS: tuple[str, ...] = ("tokenizer",)
# What an extra needs on a host beyond pyproject's own lines for it: a chat template is rendered with jinja2
# (a core dependency of the whole distribution, not of the host code: pdfleet.chat_template imports it only
# where it renders), with pdfleet's own specifier
HOST_EXTRA_ALSO: dict[str, tuple[str, ...]] = {"tokenizer": ("jinja2",)}
TOKENIZER_EXTRA = "tokenizer"
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # the oldest date a zip can hold: reproducible bytes


@dataclass(frozen=True)
class HostCode:
    """The files of the host wheel (paths relative to the package's parent) and its requirements."""

    files: tuple[str, ...]
    requirements: tuple[str, ...]
    version: str


def _module_file(package_dir: Path, dotted: str) -> Path | None:
    """The source file of a `pdfleet.x.y` module or package, if it exists."""
    parts = dotted.split(".")[1:]
    base = package_dir.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if parts and candidate.is_file():
            return candidate
    return None


def _imported_modules(source: Path, known: dict[str, list[str]], used: set[str]) -> set[str]:
    """Every `pdfleet...` module a file imports (`from pdfleet.x import y` counts y when it is a module);
    `known` maps a source text's SHA-256 to its imports (the on-disk cache, filled here on a miss), and
    `used` gathers the keys this walk read (the entries a bounded cache keeps)."""
    text = source.read_text(encoding="utf-8")
    key = hashlib.sha256(text.encode()).hexdigest()
    used.add(key)
    if key not in known:
        known[key] = sorted(_imports_in(text, str(source)))
    return set(known[key])


@functools.lru_cache(maxsize=1024)
def _imports_in(text: str, filename: str) -> frozenset[str]:
    """The `pdfleet...` modules a source text imports: a pure function of the text, so parsed once per
    process (every Deployment asks for the host version; the parse was most of its cost)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(text, filename)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] == "pdfleet"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "pdfleet":
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return frozenset(found)


def _load_imports(cache: Path | None) -> dict[str, list[str]]:
    """The imports cache (source SHA-256 -> imports); empty when absent, unreadable or not this shape."""
    if cache is None:
        return {}
    try:
        doc = json.loads(cache.expanduser().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict):
        return {}
    return {
        k: v
        for k, v in doc.items()
        if isinstance(k, str) and isinstance(v, list) and all(isinstance(m, str) for m in v)
    }


def _save_imports(cache: Path | None, known: dict[str, list[str]], used: set[str]) -> None:
    """Keep this run's entries (and older ones up to a bound) for the next process: written whole to a
    temporary file and renamed, so a concurrent reader sees the old cache or the new one; a cache that
    cannot be written costs only the parse next time."""
    if cache is None:
        return
    kept = known if len(known) <= IMPORTS_CACHE_MAX else {k: known[k] for k in used}
    path = cache.expanduser()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(kept, sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        return


def host_files(
    package_dir: Path = PACKAGE_DIR,
    cache: Path | None = DEFAULT_CACHE / IMPORTS_CACHE_NAME,
    save: bool = False,
) -> list[Path]:
    """The host packages' files, every pdfleet module they import (transitively) and its parent packages.

    Parsing ~100 sources costs every command ~0.5 s, so their imports are cached on disk by content
    (`cache`, None: no cache): an edited file is parsed again, an unchanged one never. Only `save` writes
    the cache (the commands that write the wheel beside it): a review command writes nothing."""
    known = _load_imports(cache)
    before = set(known)
    pending = [p for pkg in HOST_PACKAGES for p in sorted((package_dir / pkg).rglob("*.py"))]
    seen: set[Path] = set()
    used: set[str] = set()
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        for dotted in _imported_modules(path, known, used):
            module = _module_file(package_dir, dotted)
            if module is not None:
                pending.append(module)
    if save and set(known) != before:
        _save_imports(cache, known, used)
    for path in list(seen):
        for parent in path.relative_to(package_dir).parents:
            seen.add(package_dir / parent / "__init__.py")
    return sorted(p for p in seen if p.is_file())


def _requirement_name(requirement: str) -> str:
    """The normalised distribution name a requirement string starts with."""
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    return re.sub(r"[-_.]+", "-", match[0]).lower() if match else ""


def host_requirements() -> tuple[str, ...]:
    """Requires-Dist lines of the host wheel: pdfleet's own specifiers of the host dependencies."""
    installed = importlib.metadata.requires(DIST_NAME) or []
    wanted = set(HOST_DEPENDENCIES)
    extras = tuple(f'extra == "{extra}"' for extra in HOST_EXTRAS)
    out = []
    for req in installed:
        marker = req.split(";", 1)[1].strip() if ";" in req else ""
        if marker.startswith("extra"):
            if marker in extras:
                out.append(req)
        elif _requirement_name(req) in wanted:
            out.append(req)
    core = {_requirement_name(r): r for r in installed if ";" not in r}
    for extra in HOST_EXTRAS:
        also = HOST_EXTRA_ALSO.get(extra, ())
        out += [f'{core[name]}; extra == "{extra}"' for name in also if name in core]
        wanted_also = {name for name in also if name not in core}
        if wanted_also:
            raise PdfleetError(
                f"pdfleet's installed metadata lacks {sorted(wanted_also)} (the {extra} extra's); "
                "reinstall pdfleet (`pip install -e .`)"
            )
    missing = wanted - {_requirement_name(r) for r in out}
    if missing:
        raise PdfleetError(
            f"pdfleet's installed metadata lacks host dependencies {sorted(missing)}; "
            "reinstall pdfleet (`pip install -e .`)"
        )
    return tuple(out)


def extra_requirements(extra: str) -> tuple[str, ...]:
    """An extra's requirements without their marker (`tokenizers>=0.15`, `jinja2>=3.1`), for a host venv
    that needs them: pip checks each by name, which `pdfleet[extra]==V` would not (an installed pdfleet of
    that version satisfies it with or without the extra)."""
    marker = f'extra == "{extra}"'
    return tuple(r.split(";", 1)[0].strip() for r in host_requirements() if r.endswith(marker))


def host_code(
    package_dir: Path = PACKAGE_DIR,
    cache: Path | None = DEFAULT_CACHE / IMPORTS_CACHE_NAME,
    save: bool = False,
) -> HostCode:
    """What the host wheel holds and the version that names it (a hash of exactly that); `cache` and
    `save` as host_files takes them."""
    files = host_files(package_dir, cache, save)
    requirements = host_requirements()
    digest = hashlib.sha256()
    names = []
    for path in files:
        name = path.relative_to(package_dir.parent).as_posix()
        names.append(name)
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    for line in (*requirements, *(f"{s}={t}" for s, t in ENTRY_POINTS)):
        digest.update(line.encode() + b"\0")
    version = f"{pdfleet.__version__}+h{digest.hexdigest()[:12]}"
    return HostCode(tuple(names), requirements, version)


def host_version(package_dir: Path = PACKAGE_DIR) -> str:
    """`<release>+h<hash>`: changes exactly when what hosts run changes."""
    return host_code(package_dir).version


def wheel_name(version: str) -> str:
    """The file name of the (pure Python) host wheel of this version."""
    return f"{DIST_NAME}-{version}-py3-none-any.whl"


def record_line(name: str, data: bytes) -> str:
    """A wheel RECORD line: path, urlsafe-base64 SHA-256 without padding, size (PEP 376/427)."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _metadata(code: HostCode) -> str:
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {DIST_NAME}",
        f"Version: {code.version}",
        "Summary: pdfleet's host programs: pdfleet-gateway and pdfleet-sim",
        "Requires-Python: >=3.11",
    ]
    lines += [f"Provides-Extra: {extra}" for extra in HOST_EXTRAS]
    lines += [f"Requires-Dist: {req}" for req in code.requirements]
    return "\n".join(lines) + "\n"


def _dist_info(code: HostCode) -> dict[str, str]:
    entry_points = "[console_scripts]\n" + "".join(f"{s} = {t}\n" for s, t in ENTRY_POINTS)
    wheel = "Wheel-Version: 1.0\nGenerator: pdfleet\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    return {
        "METADATA": _metadata(code),
        "WHEEL": wheel,
        "entry_points.txt": entry_points,
        "top_level.txt": "pdfleet\n",
    }


def _write(zf: zipfile.ZipFile, name: str, data: bytes, records: list[str]) -> None:
    info = zipfile.ZipInfo(name, date_time=_ZIP_DATE)
    info.external_attr = 0o644 << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    zf.writestr(info, data)
    records.append(record_line(name, data))


def write_host_wheel(out_dir: Path, package_dir: Path = PACKAGE_DIR) -> Path:
    """Write the host wheel of these sources into out_dir (atomically); returns its path."""
    code = host_code(package_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / wheel_name(code.version)
    info_dir = f"{DIST_NAME}-{code.version}.dist-info"
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    records: list[str] = []
    with zipfile.ZipFile(tmp, "w") as zf:
        for name in code.files:
            _write(zf, name, (package_dir.parent / name).read_bytes(), records)
        for name, text in _dist_info(code).items():
            _write(zf, f"{info_dir}/{name}", text.encode(), records)
        records.append(f"{info_dir}/RECORD,,")
        _write(zf, f"{info_dir}/RECORD", ("\n".join(records) + "\n").encode(), [])
    os.replace(tmp, target)
    return target


def cached_host_wheel(
    cache_dir: Path = DEFAULT_CACHE,
    package_dir: Path = PACKAGE_DIR,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """The current host wheel from `cache_dir`, written there first when missing; older ones are removed."""
    cache_dir = cache_dir.expanduser()
    version = host_code(package_dir, cache_dir / IMPORTS_CACHE_NAME, save=True).version
    wanted = cache_dir / wheel_name(version)
    if not wanted.exists():
        if progress:
            progress(f"writing the host wheel {version} (once per host-code change) into {cache_dir}")
        write_host_wheel(cache_dir, package_dir)
    remove_other_wheels(cache_dir, keep=wanted)
    return wanted


def remove_other_wheels(directory: Path, keep: Path) -> None:
    """Delete every pdfleet wheel in `directory` but `keep`: local version labels do not order by age, so
    an index holding an old one could hand it out."""
    for old in directory.glob(f"{DIST_NAME}-*.whl"):
        if old != keep:
            old.unlink(missing_ok=True)

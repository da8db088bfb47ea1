"""The mirrors the control machine serves the lab hosts: a flat apt repository, a PEP 503 index, and a
model mirror (pdfleet.lab.model_mirror: the lab's small model at its revisions).

Provisioning in the lab runs air-gapped like a secured site: hosts reach only these servers,
bound to the bridge address. Both repositories are built on the control machine and cached by a
key over what they must contain, so a warm lab.up rebuilds nothing.

The PyPI mirror also serves this clone's host wheel (`pdfleet.fleet.host_wheel`).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from html import escape
from pathlib import Path

from pdfleet.fleet.host_wheel import (
    DIST_NAME,
    host_requirements,
    host_version,
    remove_other_wheels,
    wheel_name,
    write_host_wheel,
)
from pdfleet.hw.kv import SIM_MOONCAKE, SIM_NIXL
from pdfleet.lab.hosts import tcp_open, wait_tcp
from pdfleet.lab.image import ImageRecipe
from pdfleet.lab.paths import APT_PORT, BRIDGE_ADDRESS, MODELS_PORT, PYPI_PORT, LabPaths, pypi_mirror_url
from pdfleet.lab.system import (
    LabError,
    ProcessRef,
    Progress,
    atomic_write,
    run,
    run_streaming,
    start_detached,
)

# Hosts run bookworm's CPython 3.11 on x86_64; wheels are chosen for that, whatever runs lab.up.
HOST_PYTHON = "3.11"
HOST_ABI = "cp311"
HOST_PLATFORMS: tuple[str, ...] = (
    "manylinux1_x86_64",
    "manylinux2010_x86_64",
    "manylinux2014_x86_64",
    *(f"manylinux_2_{minor}_x86_64" for minor in range(5, 37)),
)
# Served beside the runtime requirements so a host venv can upgrade its packaging tools offline.
PACKAGING_TOOLS: tuple[str, ...] = ("pip", "setuptools", "wheel")
ROUTER_PACKAGE = "vllm-router"
# The KV transfer library's CPU build the lab's profiles install beside the simulator
# (kv_transfer.sim_library, pdfleet.hw.kv.sim_requirements): the pins pip resolves with the rest (numpy;
# Mooncake's non-CUDA engine, 46 MB, with msgpack), and those it must download without their dependencies
# (nixl-cu12 names torch, which it does not import).
KV_LIBRARY_REQUIREMENTS: tuple[str, ...] = ("numpy", SIM_MOONCAKE)
KV_LIBRARY_NO_DEPS: tuple[str, ...] = (SIM_NIXL,)


# ---------------------------------------------------------------- apt


@dataclass(frozen=True)
class AptMirrorResult:
    """What the apt mirror serves and which requested packages Debian does not have."""

    directory: Path
    packages: tuple[str, ...]
    unavailable: tuple[str, ...]


def _apt_options(work: Path, image_root: Path, archives: Path) -> list[str]:
    """apt-get options for resolving against the image's installed set with private lists and cache."""
    empty = work / "empty.d"
    empty.mkdir(parents=True, exist_ok=True)
    opts: dict[str, Path | str] = {
        "Dir::Etc::SourceList": work / "sources.list",
        "Dir::Etc::SourceParts": empty,
        "Dir::Etc::Preferences": work / "preferences",
        "Dir::Etc::PreferencesParts": empty,
        "Dir::State": work / "state",
        "Dir::State::Lists": work / "lists",
        "Dir::State::status": image_root / "var/lib/dpkg/status",
        "Dir::Cache": work / "cache",
        "Dir::Cache::archives": archives,
        "Debug::NoLocking": "1",
        "APT::Install-Recommends": "0",
    }
    for key in ("Dir::State::Lists", "Dir::Cache::archives"):
        Path(opts[key], "partial").mkdir(parents=True, exist_ok=True)
    (work / "state").mkdir(parents=True, exist_ok=True)
    (work / "cache").mkdir(parents=True, exist_ok=True)
    out: list[str] = []
    for key, value in opts.items():
        out += ["-o", f"{key}={value}"]
    return out


_MISSING = (
    re.compile(r"Unable to locate package (\S+)"),
    re.compile(r"Package '?([^' ]+)'? has no installation candidate"),
    re.compile(r"Version '[^']*' for '([^']+)' was not found"),
)


def build_apt_mirror(
    paths: LabPaths, recipe: ImageRecipe, image_root: Path, wanted: Iterable[str], progress: Progress
) -> AptMirrorResult:
    """A flat repository of `wanted` and their dependencies not already in the image (cached by key)."""
    wanted = tuple(sorted(set(wanted)))
    key = hashlib.sha256(json.dumps([recipe.key, wanted]).encode()).hexdigest()[:16]
    repos = paths.mirrors_dir / "apt-repos"
    final = repos / key
    marker = final / "pdfleet-lab.json"
    if marker.exists():
        meta = json.loads(marker.read_text())
        progress(f"apt mirror {key}: cached")
        _point(paths.apt_served, final)
        return AptMirrorResult(final, tuple(meta["packages"]), tuple(meta["unavailable"]))
    partial = repos / f"{key}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    work = paths.mirrors_dir / "apt-work"
    keyring = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
    signed = f" [signed-by={keyring}]" if keyring.exists() else ""
    work.mkdir(parents=True, exist_ok=True)
    atomic_write(work / "sources.list", f"deb{signed} {recipe.mirror} {recipe.suite} main\n")
    atomic_write(work / "preferences", "")
    opts = _apt_options(work, image_root, partial)
    progress(f"apt mirror {key}: resolving {len(wanted)} packages against the image")
    run_streaming(["apt-get", *opts, "update"], "apt-get update", progress, work / "update.log")
    remaining, unavailable = list(wanted), []
    while remaining:
        proc = run(["apt-get", *opts, "install", "--download-only", "--yes", *remaining], check=False)
        if proc.returncode == 0:
            break
        missing = {m.group(1) for rx in _MISSING for m in rx.finditer(proc.stderr)}
        missing = {name.split("=")[0] for name in missing} & set(remaining)
        if not missing:
            raise LabError(
                "apt-get could not resolve the roles' packages for the lab mirror:\n"
                + "\n".join(proc.stderr.strip().splitlines()[-15:])
            )
        unavailable += sorted(missing)
        remaining = [name for name in remaining if name not in missing]
    if unavailable:
        progress(f"apt mirror: not in Debian {recipe.suite}, skipped: {', '.join(unavailable)}")
    shutil.rmtree(partial / "partial", ignore_errors=True)
    _index_apt(partial)
    debs = sorted(p.name for p in partial.glob("*.deb"))
    atomic_write(
        partial / "pdfleet-lab.json",
        json.dumps({"packages": wanted, "unavailable": unavailable, "debs": debs}, indent=1) + "\n",
    )
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)
    _point(paths.apt_served, final)
    progress(f"apt mirror {key}: {len(debs)} .deb files")
    return AptMirrorResult(final, wanted, tuple(unavailable))


def _index_apt(repo: Path) -> None:
    """Packages, Packages.gz and a Release file for a flat repository (`deb URI ./`)."""
    packages = run(["dpkg-scanpackages", "--multiversion", ".", "/dev/null"], cwd=repo).stdout
    atomic_write(repo / "Packages", packages)
    atomic_write(repo / "Packages.gz", gzip.compress(packages.encode(), mtime=0))
    lines = [
        "Origin: pdfleet-lab",
        "Label: pdfleet-lab",
        "Suite: lab",
        "Codename: lab",
        f"Date: {time.strftime('%a, %d %b %Y %H:%M:%S UTC', time.gmtime())}",
        "SHA256:",
    ]
    for name in ("Packages", "Packages.gz"):
        data = (repo / name).read_bytes()
        lines.append(f" {hashlib.sha256(data).hexdigest()} {len(data)} {name}")
    atomic_write(repo / "Release", "\n".join(lines) + "\n")


def _point(link: Path, target: Path) -> None:
    """Atomically make `link` a symlink to `target` (the server follows it per request)."""
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(f".{link.name}.new")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    os.replace(tmp, link)


# ---------------------------------------------------------------- PyPI


def pypi_requirements() -> list[str]:
    """What hosts pip-install: the host wheel's requirements (extras too), vllm-router, packaging tools."""
    reqs = [req.split(";", 1)[0].strip() if "extra ==" in req else req for req in host_requirements()]
    router = [r for r in importlib.metadata.requires(DIST_NAME) or [] if re.match(rf"{ROUTER_PACKAGE}\b", r)]
    reqs += [r.split(";", 1)[0].strip() for r in router] or [ROUTER_PACKAGE]
    reqs += list(PACKAGING_TOOLS)
    return reqs + list(KV_LIBRARY_REQUIREMENTS)


def _pip_download(dest: Path, requirements: Path, no_deps: bool = False) -> list[str]:
    """pip download of a requirements file's wheels for the hosts' Python and platforms."""
    return [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--disable-pip-version-check",
        *(["--no-deps"] if no_deps else []),
        "--dest",
        str(dest),
        "--only-binary=:all:",
        "--python-version",
        HOST_PYTHON,
        "--implementation",
        "cp",
        "--abi",
        HOST_ABI,
        "--abi",
        "abi3",
        "--abi",
        "none",
        *(arg for plat in HOST_PLATFORMS for arg in ("--platform", plat)),
        "--requirement",
        str(requirements),
    ]


def build_pypi_deps(paths: LabPaths, progress: Progress) -> Path:
    """Wheels of every third-party requirement for the hosts' Python (cached by key)."""
    reqs = pypi_requirements()
    key = hashlib.sha256(
        json.dumps([reqs, KV_LIBRARY_NO_DEPS, HOST_ABI, HOST_PLATFORMS]).encode()
    ).hexdigest()[:16]
    final = paths.mirrors_dir / "pypi-deps" / key
    if (final / "COMPLETE").exists():
        progress(f"pypi deps {key}: cached")
        return final
    partial = final.with_name(f"{key}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    atomic_write(partial / "requirements.txt", "\n".join(reqs) + "\n")
    atomic_write(partial / "no-deps.txt", "\n".join(KV_LIBRARY_NO_DEPS) + "\n")
    progress(f"pypi deps {key}: downloading wheels for {len(reqs)} requirements (cold: about a minute)")
    run_streaming(
        _pip_download(partial, partial / "requirements.txt"), "pip download", progress, partial / "pip.log"
    )
    progress(f"pypi deps {key}: {', '.join(KV_LIBRARY_NO_DEPS)} without dependencies")
    no_deps = _pip_download(partial, partial / "no-deps.txt", no_deps=True)
    run_streaming(no_deps, "pip download --no-deps", progress, partial / "pip-no-deps.log")
    atomic_write(partial / "COMPLETE", "")
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)
    for old in final.parent.iterdir():  # superseded requirement sets
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    return final


def refresh_host_wheel(paths: LabPaths | None = None) -> str:
    """Serve the host wheel of this clone's current sources; returns its version (a no-op when current)."""
    paths = paths or LabPaths()
    packages = paths.pypi_dir / "packages"
    packages.mkdir(parents=True, exist_ok=True)
    version = host_version()
    wheel = packages / wheel_name(version)
    if not wheel.exists():
        write_host_wheel(packages)
    remove_other_wheels(packages, keep=wheel)
    write_simple_index(paths.pypi_dir)
    return version


def populate_pypi(paths: LabPaths, deps: Path) -> None:
    """Put the dependency wheels into the served tree (hard links; the cache stays the source)."""
    packages = paths.pypi_dir / "packages"
    packages.mkdir(parents=True, exist_ok=True)
    wanted = {p.name for p in deps.glob("*.whl")}
    for old in packages.glob("*.whl"):
        if not old.name.startswith(f"{DIST_NAME}-") and old.name not in wanted:
            old.unlink()
    for whl in deps.glob("*.whl"):
        dest = packages / whl.name
        if not dest.exists():
            try:
                os.link(whl, dest)
            except OSError:
                shutil.copy2(whl, dest)


def normalize(name: str) -> str:
    """PEP 503 project name normalisation."""
    return re.sub(r"[-_.]+", "-", name).lower()


INDEX_STAMP = ".pdfleet-wheels.json"  # in simple/: the wheels (name, size, mtime) its pages were written for


def wheels_stamp(wheels: Iterable[Path]) -> str:
    """What an index's pages depend on: each wheel's name, size and modification time (a rewritten or
    replaced wheel changes them)."""
    return json.dumps([[w.name, (st := w.stat()).st_size, st.st_mtime_ns] for w in sorted(wheels)])


def write_simple_index(root: Path) -> None:
    """PEP 503 pages under root/simple/ for every wheel in root/packages/ (sha256 fragments included);
    nothing when they were written for these very wheels (every provision and lab.up asks, and hashing
    the ~130 MB of wheels took ~0.2 s each time)."""
    wheels = sorted((root / "packages").glob("*.whl"))
    stamp = wheels_stamp(wheels)
    simple = root / "simple"
    with contextlib.suppress(OSError):
        if (simple / INDEX_STAMP).read_text() == stamp:
            return
    by_project: dict[str, list[Path]] = {}
    for whl in wheels:
        by_project.setdefault(normalize(whl.name.split("-")[0]), []).append(whl)
    fresh = simple.with_name(".simple.new")
    shutil.rmtree(fresh, ignore_errors=True)
    fresh.mkdir(parents=True)
    (fresh / INDEX_STAMP).write_text(stamp)
    page = (
        '<!DOCTYPE html>\n<html><head><meta name="pypi:repository-version" content="1.0"></head>'
        "<body>\n{}</body></html>\n"
    )
    top = "".join(f'<a href="{p}/">{p}</a><br>\n' for p in sorted(by_project))
    (fresh / "index.html").write_text(page.format(top))
    for project, files in by_project.items():
        links = "".join(
            f'<a href="../../packages/{escape(f.name)}#sha256={hashlib.sha256(f.read_bytes()).hexdigest()}">'
            f"{escape(f.name)}</a><br>\n"
            for f in files
        )
        (fresh / project).mkdir()
        (fresh / project / "index.html").write_text(page.format(links))
    old = simple.with_name(".simple.old")
    shutil.rmtree(old, ignore_errors=True)
    if simple.exists():
        simple.rename(old)
    fresh.rename(simple)
    shutil.rmtree(old, ignore_errors=True)


# ---------------------------------------------------------------- servers

SERVERS: dict[str, int] = {"apt": APT_PORT, "pypi": PYPI_PORT, "models": MODELS_PORT}
# the model mirror answers byte ranges (an interrupted copy continues); http.server does not
SERVER_MODULES: dict[str, str] = {"models": "pdfleet.lab.model_mirror"}


def served_directory(paths: LabPaths, kind: str) -> Path:
    return {"apt": paths.apt_served, "pypi": paths.pypi_dir, "models": paths.models_dir}[kind]


def server_command(paths: LabPaths, kind: str) -> list[str]:
    """A static HTTP server bound to the bridge address only."""
    return [
        sys.executable,
        "-m",
        SERVER_MODULES.get(kind, "http.server"),
        "--bind",
        BRIDGE_ADDRESS,
        "--directory",
        str(served_directory(paths, kind)),
        str(SERVERS[kind]),
    ]


def start_server(paths: LabPaths, kind: str, existing: ProcessRef | None) -> ProcessRef:
    """Start (or keep) the mirror server of this kind; refuses a port held by something else."""
    if existing and existing.alive():
        return existing
    port = SERVERS[kind]
    if tcp_open(BRIDGE_ADDRESS, port, 0.5):
        raise LabError(
            f"port {BRIDGE_ADDRESS}:{port} is taken by a process lab.up did not start; "
            f"stop it (see `ss -ltnp 'sport = :{port}'`) and run lab.up again."
        )
    proc = start_detached(server_command(paths, kind), paths.run_dir / f"{kind}-mirror.log")
    ref = ProcessRef.of(proc.pid)
    if ref is None or not wait_tcp(BRIDGE_ADDRESS, port, 10.0):
        raise LabError(f"the {kind} mirror server did not start; see {paths.run_dir / f'{kind}-mirror.log'}.")
    return ref


def leftover_servers(paths: LabPaths) -> list[ProcessRef]:
    """Mirror servers of this lab whose record was lost (a killed lab.up): matched by exact command line."""
    wanted = {tuple(server_command(paths, kind)[1:]) for kind in SERVERS}
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
        except OSError:
            continue
        if tuple(argv[1:]) in wanted and "python" in Path(argv[0]).name:
            ref = ProcessRef.of(int(entry.name))
            if ref:
                found.append(ref)
    return found


def refresh_if_served_here(pypi_url: str | None, paths: LabPaths | None = None) -> str | None:
    """When a profile's PyPI mirror is the lab's own and it is running, serve this clone's wheel on it,
    so the version provision pins is there; returns that version, or None when not the lab's mirror."""
    paths = paths or LabPaths()
    if pypi_url is None or pypi_url.rstrip("/") != pypi_mirror_url().rstrip("/"):
        return None
    if not paths.pypi_dir.is_dir():
        return None
    return refresh_host_wheel(paths)

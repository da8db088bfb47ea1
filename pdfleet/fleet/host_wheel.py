"""This clone's pdfleet as a wheel for hosts: built once per source version, relabelled with it.

Hosts that run pdfleet code (the gateway; the simulator in the lab) must run exactly the code of the
clone that provisions them, and a real site's PyPI mirror does not carry that. So provision builds
the wheel on the control machine (cached by version), uploads it, and pip installs it from a local
directory on the host, taking only the dependencies from the site's index. pip builds the wheel with
pyproject.toml's static version; `retag_wheel` rewrites the dist-info name, METADATA and RECORD to
`<release>+g<source hash>` (`pdfleet.fleet.host_version.wheel_version`). pyproject.toml never changes.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from pdfleet.errors import PdfleetError
from pdfleet.fleet.host_version import wheel_version

DEFAULT_CACHE = Path("~/.cache/pdfleet/wheels")


def wheel_name(version: str) -> str:
    """The file name of pdfleet's (pure Python) wheel of this version."""
    return f"pdfleet-{version}-py3-none-any.whl"


def build_pdfleet_wheel(repo_root: Path, out_dir: Path, build_tools: Path | None) -> Path:
    """pdfleet's wheel from this clone's sources, built in a scratch copy, relabelled with the source hash.

    With `build_tools` (a directory of setuptools/wheel wheels, e.g. the lab mirror's) the isolated
    build env needs no index; without, pip fetches them from the configured index as usual.
    """
    version = wheel_version(repo_root / "pdfleet")
    with tempfile.TemporaryDirectory(prefix="pdfleet-wheel-") as tmp:
        src = Path(tmp, "src")
        shutil.copytree(repo_root / "pdfleet", src / "pdfleet",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
        shutil.copy2(repo_root / "pyproject.toml", src / "pyproject.toml")
        readme = repo_root / "README.md"
        # pyproject names a readme; a clone without one still builds.
        (src / "README.md").write_text(readme.read_text() if readme.exists() else "pdfleet\n")
        built = Path(tmp, "out")
        index = ["--no-index", "--find-links", str(build_tools)] if build_tools else []
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", *index, "--disable-pip-version-check",
               "--wheel-dir", str(built), str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-15:]
            raise PdfleetError(f"building the pdfleet wheel failed (`{' '.join(cmd)}`, "
                               f"exit {proc.returncode}):\n" + "\n".join(tail))
        wheels = list(built.glob("pdfleet-*.whl"))
        if len(wheels) != 1:
            names = [w.name for w in wheels]
            raise PdfleetError(f"building the pdfleet wheel produced {names}, expected one.")
        out_dir.mkdir(parents=True, exist_ok=True)
        return retag_wheel(wheels[0], version, out_dir)


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def retag_wheel(wheel: Path, version: str, out_dir: Path) -> Path:
    """Copy a wheel under a new version: dist-info renamed, METADATA's Version and RECORD rewritten."""
    name, old_version = wheel.name.split("-")[:2]
    old_info, new_info = f"{name}-{old_version}.dist-info/", f"{name}-{version}.dist-info/"
    target = out_dir / wheel.name.replace(f"{name}-{old_version}-", f"{name}-{version}-", 1)
    records: list[str] = []
    tmp = target.with_name(f".{target.name}.tmp")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            arcname = info.filename
            if arcname.startswith(old_info):
                arcname = new_info + arcname[len(old_info):]
            if arcname == new_info + "RECORD":
                continue
            data = src.read(info)
            if arcname == new_info + "METADATA":
                data = re.sub(rb"^Version: .*$", f"Version: {version}".encode(), data, count=1, flags=re.M)
            dst.writestr(zipfile.ZipInfo(arcname, date_time=info.date_time), data,
                         compress_type=zipfile.ZIP_DEFLATED)
            records.append(f"{arcname},{_record_hash(data)},{len(data)}")
        records.append(f"{new_info}RECORD,,")
        dst.writestr(new_info + "RECORD", "\n".join(records) + "\n", compress_type=zipfile.ZIP_DEFLATED)
    os.replace(tmp, target)
    return target


def clone_wheel(repo_root: Path, cache_dir: Path = DEFAULT_CACHE, build_tools: Path | None = None,
                progress: Callable[[str], None] | None = None) -> Path:
    """The wheel of the clone's current sources from `cache_dir`, built there first when missing.

    Older pdfleet wheels in the cache are removed: one version per clone state is all a host needs.
    """
    cache_dir = cache_dir.expanduser()
    version = wheel_version(repo_root / "pdfleet")
    wanted = cache_dir / wheel_name(version)
    if not wanted.exists():
        if progress:
            progress(f"building the pdfleet wheel {version} (once per source change) into {cache_dir}")
        built = build_pdfleet_wheel(repo_root, cache_dir, build_tools)
        if built != wanted:
            raise PdfleetError(f"the pdfleet wheel came out as {built.name}, expected {wanted.name}")
    for old in cache_dir.glob("pdfleet-*.whl"):
        if old != wanted:
            old.unlink(missing_ok=True)
    return wanted

"""The version hosts install: the release plus a hash of the package sources.

A lab or site mirror built from this clone serves a wheel with exactly this version, so a host's
venv is converged only when it runs the code of the clone that provisions it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pdfleet

PACKAGE_DIR = Path(pdfleet.__file__).resolve().parent


def source_hash(package_dir: Path = PACKAGE_DIR) -> str:
    """A short hash of every .py file under the package (path and content), stable across machines."""
    digest = hashlib.sha256()
    for path in sorted(package_dir.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        digest.update(path.relative_to(package_dir).as_posix().encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def wheel_version(package_dir: Path = PACKAGE_DIR) -> str:
    """`<release>+g<source hash>`: a PEP 440 local version that changes whenever the code does."""
    return f"{pdfleet.__version__}+g{source_hash(package_dir)}"

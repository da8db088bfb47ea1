"""The lab's PyPI mirror: what hosts install, and a PEP 503 index pip resolves from."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pdfleet.fleet.host_wheel import record_line
from pdfleet.lab.mirrors import pypi_requirements, write_simple_index

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py


def test_pypi_requirements_cover_pdfleet_and_the_router() -> None:
    reqs = pypi_requirements()
    assert any(r.startswith("vllm-router") for r in reqs)
    assert any(r.startswith("pydantic") for r in reqs)
    assert "pip" in reqs


def _make_wheel(path: Path, version: str = "0.1.0") -> Path:
    wheel = path / f"demo-{version}-py3-none-any.whl"
    info = f"demo-{version}.dist-info"
    files = {
        "demo/__init__.py": b"VALUE = 42\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: demo\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr(
            f"{info}/RECORD",
            "".join(record_line(n, d) + "\n" for n, d in files.items()) + f"{info}/RECORD,,\n",
        )
    return wheel


def test_simple_index_is_pep503_and_pip_resolves_from_it(tmp_path: Path) -> None:
    root = tmp_path / "pypi"
    (root / "packages").mkdir(parents=True)
    wheel = _make_wheel(root / "packages", "0.1.0+gdef456")
    write_simple_index(root)
    page = (root / "simple" / "demo" / "index.html").read_text()
    assert f"#sha256={hashlib.sha256(wheel.read_bytes()).hexdigest()}" in page
    assert 'href="demo/"' in (root / "simple" / "index.html").read_text()
    dest = tmp_path / "dl"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--quiet",
            "--isolated",
            "--index-url",
            (root / "simple").as_uri(),
            "--dest",
            str(dest),
            "demo",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in dest.iterdir()] == [wheel.name]


def test_simple_index_is_rewritten_only_when_the_wheels_change(tmp_path: Path) -> None:
    """Every provision and lab.up asks for the index: the same wheels leave the pages as they are (no
    wheel hashed again); a wheel added, or one rewritten in place, writes them anew."""
    root = tmp_path / "pypi"
    (root / "packages").mkdir(parents=True)
    _make_wheel(root / "packages", "0.1.0")
    write_simple_index(root)
    page = root / "simple" / "demo" / "index.html"
    page.write_text("kept")  # the marker a rewrite would replace
    write_simple_index(root)
    assert page.read_text() == "kept"
    newer = _make_wheel(root / "packages", "0.2.0")
    write_simple_index(root)
    assert newer.name in page.read_text() and "0.1.0" in page.read_text()
    page.write_text("kept")
    data = newer.read_bytes()
    newer.unlink()
    newer.write_bytes(data + b"\0")  # the same name, other bytes
    write_simple_index(root)
    assert f"#sha256={hashlib.sha256(newer.read_bytes()).hexdigest()}" in page.read_text()

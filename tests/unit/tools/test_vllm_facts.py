"""The regenerate-and-review loop: the committed table is exactly what the script writes, a wheel whose
facts differ shows up as a diff (exit 1), and bad input is refused with a message (exit 2)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from pdfleet.model import vllm_release_data, vllm_releases
from tools import vllm_facts

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def fixture_wheel(cache: Path, version: str) -> Path:
    """A wheel holding the excerpts of one release (as its .py files), where the script caches wheels."""
    cache.mkdir(parents=True, exist_ok=True)
    wheel = cache / f"vllm-{version}-py3-none-any.whl"
    root = FIXTURES / f"vllm-{version}"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path in root.rglob("*.py.txt"):
            archive.writestr(path.relative_to(root).as_posix().removesuffix(".txt"), path.read_text())
    return wheel


def test_the_committed_table_is_what_the_script_writes() -> None:
    written = vllm_facts.module_text(vllm_release_data.RELEASES)
    assert written == vllm_facts.DATA_MODULE.read_text(encoding="utf-8")


@pytest.mark.parametrize("version", sorted(vllm_release_data.RELEASES))
def test_render_reads_back_as_the_same_row(version: str) -> None:
    release = vllm_release_data.RELEASES[version]
    text = vllm_facts.render(release)
    assert max(len(line) for line in text.splitlines()) <= vllm_facts.WIDTH
    names = {n: getattr(vllm_releases, n) for n in dir(vllm_releases) if not n.startswith("_")}
    assert eval(text, names) == release  # noqa: S307 - our own rendering of our own dataclasses


def test_a_release_whose_facts_differ_is_shown_as_a_diff(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fixture_wheel(tmp_path, "0.11.0")
    assert vllm_facts.main(["0.11.0", "--cache", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("vLLM 0.11.0\n")
    assert "unknown keys: ignore" in out and "KV hold: timeout 120 s" in out
    # the excerpt registers four connectors; the committed table (the whole wheel) six
    assert "--- table 0.11.0\n+++ wheel 0.11.0" in out
    assert '-                name="MultiConnector",' in out


def test_write_keeps_the_other_releases(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fixture_wheel(tmp_path, "0.33.0")
    out = tmp_path / "table.py"
    assert vllm_facts.main(["0.33.0", "--cache", str(tmp_path), "--write", "--out", str(out)]) == 0
    text = out.read_text()
    assert "V0_11_0 = Release(" in text and "V0_33_0 = Release(" in text and 'NEWEST = "0.33.0"' in text
    assert text != vllm_facts.DATA_MODULE.read_text()  # 0.33.0 now holds the excerpt's facts
    assert f"wrote {out}" in capsys.readouterr().out


def test_fetch_only_caches_the_wheels_and_derives_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    wheel = fixture_wheel(tmp_path, "0.11.0")  # cached: nothing to download, and no diff is printed
    assert vllm_facts.main(["0.11.0", "--cache", str(tmp_path), "--fetch"]) == 0
    assert capsys.readouterr().out == f"vLLM 0.11.0: {wheel}\n"
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # a release not cached and not fetchable: named, exit 2
    assert vllm_facts.main(["0.0.1", "--cache", str(tmp_path), "--fetch"]) == 2
    assert capsys.readouterr().err.startswith("vllm_facts: vllm==0.0.1: pip download failed: ")


def test_bad_version_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert vllm_facts.main(["latest", "--cache", str(tmp_path)]) == 2
    assert capsys.readouterr().err == "vllm_facts: 'latest': give an exact release like 0.33.0\n"
    assert list(tmp_path.iterdir()) == []


def test_a_release_pip_cannot_fetch_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # local find-links only: nothing leaves the machine
    assert vllm_facts.main(["0.0.1", "--cache", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vllm_facts: vllm==0.0.1: pip download failed: ")


def test_a_fact_the_table_cannot_hold_is_named_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """0.34.0's NixlConnector reads `get_from_extra_config('ucx_backend_params', {})`: a default the table's
    types cannot hold stops the script with the release and the expression (exit 2), not a traceback."""
    wheel = fixture_wheel(tmp_path, "0.33.0")
    name = "vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py"
    with zipfile.ZipFile(wheel) as archive:
        files = {n: archive.read(n) for n in archive.namelist()}
    files[name] += (
        b"\ndef _more(self):\n    self.kv_transfer_config.get_from_extra_config('ucx_backend_params', {})\n"
    )
    with zipfile.ZipFile(wheel, "w") as archive:
        for n, data in files.items():
            archive.writestr(n, data)
    assert vllm_facts.main(["0.33.0", "--cache", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vllm_facts: vLLM 0.33.0: unreadable fact ") and "'ucx_backend_params', {}" in err

"""`invoke rebalance`: the dry run prints the mover's steps, the layout after the move and the hosts it
provisions from the live layout (the copy last read from the fleet); a refused dry run exits non-zero
naming why and writes nothing, and bad options are refused before anything is read. A live move reads
and audits the layout on the gateway hosts: tests/lab/test_lab_rebalance.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from invoke.exceptions import Exit

from pdfleet.cli.rebalance import rebalance
from tests.unit.cli.helpers import REPO, project_context


def _state(tmp_path: Path) -> Path:
    return tmp_path / "layouts" / "lab-lab-cross.json"


def test_the_dry_run_prints_the_steps_the_layout_after_and_the_hosts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rebalance(
        project_context(output_dir=str(tmp_path)),
        profile="lab-cross",
        host="lab-colo2",
        to="decode",
        wait=30,
        dry_run=True,
    )
    out = capsys.readouterr().out
    assert "layout: the inventory's pool groups" in out
    assert "rebalance lab-colo2: colocated -> decode (dry run: nothing changes)" in out
    assert "  2. wait: wait for lab-colo2's in-flight requests (at most 30 s)" in out
    assert "  decode: lab-colo2, lab-d1\n  colocated: lab-colo1\n" in out
    assert "provisions: lab-colo2, lab-gw " in out
    assert list(tmp_path.iterdir()) == []


def test_the_dry_run_starts_from_the_live_layout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hosts = {"lab-colo1": ["colocated"], "lab-colo2": ["decode"], "lab-p1": ["prefill"], "lab-d1": ["decode"]}
    _state(tmp_path).parent.mkdir()
    _state(tmp_path).write_text(json.dumps({"profile": "lab-cross", "inventory": "i", "hosts": hosts}))
    ctx = project_context(output_dir=str(tmp_path))
    rebalance(ctx, profile="lab-cross", host="lab-d1", to="prefill", dry_run=True)
    out = capsys.readouterr().out
    assert "layout: the live layout as last read from the fleet's gateway hosts, copied in" in out
    assert "rebalance lab-d1: decode -> prefill" in out
    assert "  prefill: lab-p1, lab-d1\n  decode: lab-colo2\n" in out


@pytest.mark.parametrize(
    ("host", "to", "dry_run", "expected"),
    [
        ("lab-d1", "prefill", True, "refused: host lab-d1 is the last host of the decode pool"),
        ("lab-gw", "decode", True, "refused: host 'lab-gw' serves no pool"),
    ],
)
def test_a_refused_dry_run_exits_naming_why_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], host: str, to: str, dry_run: bool, expected: str
) -> None:
    ctx = project_context(output_dir=str(tmp_path))
    with pytest.raises(Exit):
        rebalance(ctx, profile="lab-cross", host=host, to=to, dry_run=dry_run)
    captured = capsys.readouterr()
    assert expected in captured.err and "rebalance lab-colo2:" not in captured.out
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("wait", "reason", "expected"), [(0, "x", "--wait must be"), (5, " ", "--reason must")]
)
def test_bad_options_are_refused_before_anything_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], wait: int, reason: str, expected: str
) -> None:
    ctx = project_context(output_dir=str(tmp_path))
    with pytest.raises(Exit):
        rebalance(ctx, profile="lab-cross", host="lab-colo2", to="decode", wait=wait, reason=reason)
    assert expected in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("profile", "options", "expected"),
    [
        ("lab-cross", {"proposed": True, "host": "lab-colo2"}, "not with --host/--to/--to-plan"),
        ("lab-cross", {"follow": "5", "to_plan": "p.json"}, "not with --host/--to/--to-plan"),
        ("lab-cross", {"proposed": True, "dry_run": True}, "the controller's dry run is"),
        ("lab-cross", {"follow": "0"}, "--follow must be a positive number"),
        ("lab-cross", {"follow": "soon"}, "--follow: 'soon' is not a number"),
        ("lab-cross", {"proposed": True}, "rollout.rebalance.mode is off"),
        ("lab-cross-auto", {"proposed": True}, "rollout.rebalance.mode is dry-run"),
    ],
)
def test_carrying_out_proposals_refuses_bad_input_before_any_host(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    profile: str,
    options: dict[str, object],
    expected: str,
) -> None:
    ctx = project_context(output_dir=str(tmp_path))
    with pytest.raises(Exit):
        rebalance(ctx, profile=profile, **options)  # type: ignore[arg-type]
    assert expected in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.procs  # starts invoke: see tests/unit/conftest.py
def test_every_option_has_help() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", "--help", "rebalance"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    options = (
        "--profile",
        "--inventory",
        "--host",
        "--to",
        "--wait",
        "--reason",
        "--to-plan",
        "--hold",
        "--proposed",
        "--follow",
        "--dry-run",
    )
    for option in options:
        line = next(ln for ln in proc.stdout.splitlines() if option in ln)
        assert len(line.split()) > 2, f"{option} has no help"

"""Shared pieces of the task tests: a Context carrying this repo's invoke.yaml, as `invoke` builds it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from invoke import Config, Context

REPO = Path(__file__).resolve().parents[3]


def project_context(**pdfleet: Any) -> Context:
    """A Context with the repo's invoke.yaml loaded, and `pdfleet:` keys overridden as given."""
    config = Config(project_location=str(REPO), overrides={"pdfleet": pdfleet} if pdfleet else None)
    config.load_project()
    return Context(config)


# Runs each argv through invoke's own Program (as `python -m invoke` does: tasks.py and invoke.yaml found
# from the repo), one after another in one process, each with its own stdout/stderr and exit code.
_MANY = r"""
import contextlib, io, json, sys, traceback
from invoke.main import program

results = []
for argv in json.loads(sys.stdin.read()):
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            program.run(["invoke", *argv])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
    results.append([code, out.getvalue(), err.getvalue()])
print(json.dumps(results))
"""


def invoke_many(cases: list[list[str]], timeout: float = 300) -> list[subprocess.CompletedProcess[str]]:
    """`invoke ARGV...` for each case through the real CLI path (invoke's parser, the task, its errors and
    exit code), in one process: the ~0.5 CPU-s of starting invoke paid once, not per case."""
    proc = subprocess.run(
        [sys.executable, "-c", _MANY],
        input=json.dumps(cases),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )
    return [
        subprocess.CompletedProcess(["invoke", *argv], code, out, err)
        for argv, (code, out, err) in zip(cases, json.loads(proc.stdout), strict=True)
    ]

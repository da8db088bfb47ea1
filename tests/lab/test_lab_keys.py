"""Named keys on the provisioned lab-cross fleet (issue 28), over HTTPS with the lab CA: `invoke keys.add`
gives a key that works once the command returns, `keys.rotate` a new one while the old works until its
grace ends (the gateway refuses it itself after, no reload), `keys.revoke` refuses the key (401) as soon as
its reload is done; `keys.list` names the key and never shows it. Every change is a reload, not a
restart, and a light load of streams through the gateway with the lab's client key sees no failure."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.lab.helpers import REPO_ROOT, LabHandle, lab_deployment, lab_env, sdk_verify

PROFILE = "lab-cross"
MODEL = "llama-3.1-8b"
NAME = "lab-keys-test"
# the rotation's grace: longer than its own reload (~3.5 s of keys.rotate's 5 s in the lab, twice that
# under load), short for the suite; the test polls for its end instead of sleeping past it
GRACE_S = 12.0


def _invoke(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


def _client(key: str) -> openai.OpenAI:
    """The SDK as `invoke lab.env` sets it up (the lab CA trusted), with `key`."""
    env = lab_env()
    verify = openai.DefaultHttpxClient(verify=sdk_verify(env))
    return openai.OpenAI(
        base_url=env["OPENAI_BASE_URL"], api_key=key, max_retries=0, timeout=30, http_client=verify
    )


def _status(key: str) -> int:
    """What the gateway answers `key` on GET /v1/models: 200, or the error's status (401 refused)."""
    try:
        _client(key).models.list()
    except openai.APIStatusError as exc:
        return exc.status_code
    return 200


def _until_refused(key: str, deadline: float) -> float:
    """Poll `key` until the gateway refuses it (401); when (time.monotonic()) it first did."""
    while (status := _status(key)) == 200 and time.monotonic() < deadline:
        time.sleep(0.25)
    assert status == 401, f"the old key still answered {status} past its grace"
    return time.monotonic()


def _key_file() -> Path:
    return Path(lab_deployment(PROFILE).profile.gateway.keys_dir) / f"{NAME}.key"


def _main_pid(lab: LabHandle) -> str:
    gw = next(h for h in lab.hosts if h.name == "lab-gw")
    _, pid, _ = lab.ssh(gw, "systemctl show -p MainPID --value pdfleet-gateway.service")
    return pid.strip()


@pytest.fixture
def load(lab: LabHandle) -> Iterator[list[str]]:
    """Streams with the lab's client key, one after another, until the test ends; the failures seen."""
    env, failures, stop = lab_env(), [], threading.Event()
    client = _client(env["OPENAI_API_KEY"])
    done = [0]

    def streams() -> None:
        while not stop.is_set():
            try:
                chunks = client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "count"}], max_tokens=24, stream=True
                )
                if not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices):
                    failures.append("an empty stream")
                done[0] += 1
            except Exception as exc:  # any failure in flight is the finding
                failures.append(repr(exc))

    worker = threading.Thread(target=streams)
    worker.start()
    yield failures
    stop.set()
    worker.join(60)
    assert done[0] > 0, "the load sent nothing"


def test_add_rotate_revoke_apply_by_reload_with_no_failed_request(lab: LabHandle, load: list[str]) -> None:
    pid = _main_pid(lab)
    try:
        _invoke("keys.add", "--profile", PROFILE, "--name", NAME)
        first = _key_file().read_text().strip()
        assert _status(first) == 200
        asked = time.monotonic()  # the grace ends GRACE_S after the rotation's own clock reading, not before
        _invoke("keys.rotate", "--profile", PROFILE, "--name", NAME, "--grace-minutes", str(GRACE_S / 60))
        second = _key_file().read_text().strip()
        assert second != first
        assert (_status(first), _status(second)) == (200, 200), "both keys work during the grace"
        listed = _invoke("keys.list", "--profile", PROFILE)
        assert NAME in listed and first not in listed and second not in listed
        refused = _until_refused(first, asked + GRACE_S + 10)
        assert refused - asked >= GRACE_S, f"the old key stopped {refused - asked:.1f} s after the rotation"
        assert _status(second) == 200, "the new key works after the grace"
        _invoke("keys.revoke", "--profile", PROFILE, "--name", NAME)
        assert _status(second) == 401, "revoked within its reload"
    finally:
        if _key_file().exists():  # a failure above: the lab's registry without the test's key
            _invoke("keys.revoke", "--profile", PROFILE, "--name", NAME)
    assert _main_pid(lab) == pid, "keys are applied by a reload, not a restart"
    assert load == [], load[:3]

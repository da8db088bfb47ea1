"""The follower lock beside the live layout (one `invoke rebalance --follow` per profile): a second follower
of the same profile is refused naming the first, another profile's is not; it is freed on release and when
its holder dies (a killed process), through this machine's shell and through a real SSH connection to the
loopback sshd, each standing for the first gateway host, with the real `flock`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pdfleet.errors import ValidationError
from pdfleet.fleet.layout_store import FleetLayout, FollowerLock
from pdfleet.model.inventory import Host
from pdfleet.ops.ssh import LocalTransport, Transport, open_connection
from tests.unit.fleet.helpers import REPO
from tests.unit.helpers import Sshd

pytestmark = pytest.mark.procs  # this machine's shell and sshd stand for the gateway hosts


def _store(root: Path, over: dict[str, object] | None = None, profile: str = "lab-cross") -> FleetLayout:
    """The live layout's directory under `root` on one gateway host: this machine's shell, or the sshd
    `over` names (port, key, known_hosts)."""
    if over is None:
        host = Host("lab-gw", frozenset(), {}, "127.0.0.1")

        def connect(h: Host) -> Transport:
            return LocalTransport(h.name)
    else:
        port, key, known = int(str(over["port"])), str(over["key"]), str(over["known"])
        host = Host("lab-gw", frozenset(), {}, "127.0.0.1", port, "root", key, known)

        def connect(h: Host) -> Transport:
            return open_connection(h, known, 5)

    return FleetLayout([host], connect, profile, str(root / "layouts"), False)


def _over(sshd: Sshd | None) -> dict[str, object] | None:
    if sshd is None:
        return None
    return {"port": sshd.port, "key": str(sshd.key_file), "known": str(sshd.known_hosts)}


@pytest.fixture(params=["shell", "ssh"])
def over(request: pytest.FixtureRequest) -> dict[str, object] | None:
    return _over(request.getfixturevalue("sshd") if request.param == "ssh" else None)


def test_a_second_follower_of_a_profile_is_refused_naming_the_first_until_it_releases(
    tmp_path: Path, over: dict[str, object] | None
) -> None:
    first = FollowerLock(_store(tmp_path, over), "ctl-1 pid 11").take()
    assert first.alive
    with pytest.raises(
        ValidationError, match=r"another follower carries out lab-cross's proposals \(ctl-1 pid 11;"
    ):
        FollowerLock(_store(tmp_path, over), "ctl-2 pid 22").take()
    other = FollowerLock(_store(tmp_path, over, "lab-16"), "ctl-2 pid 22").take()  # another profile's lock
    other.release()
    first.release()
    assert not first.alive
    second = FollowerLock(_store(tmp_path, over), "ctl-2 pid 22").take()
    second.release()
    marks = sorted(p.name for p in (tmp_path / "layouts").iterdir())
    assert marks == [
        "lab-16.follow.lock",
        "lab-16.follow.owner",
        "lab-cross.follow.lock",
        "lab-cross.follow.owner",
    ]


def test_the_lock_is_freed_when_its_follower_dies(tmp_path: Path, over: dict[str, object] | None) -> None:
    script = (
        "import json, sys, time\n"
        "from pathlib import Path\n"
        "from tests.unit.fleet.test_layout_store import FollowerLock, _store\n"
        "FollowerLock(_store(Path(sys.argv[1]), json.loads(sys.argv[2])), 'doomed pid 1').take()\n"
        "print('held', flush=True)\n"
        "time.sleep(600)\n"
    )
    argv = [sys.executable, "-c", script, str(tmp_path), json.dumps(over)]
    holder = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(ValidationError, match="doomed pid 1"):
            FollowerLock(_store(tmp_path, over), "next").take()
    finally:
        holder.kill()  # a crash: no release; the kernel closes its pipes, or its SSH connection
        holder.wait()
    deadline = time.monotonic() + 10
    while True:
        try:
            FollowerLock(_store(tmp_path, over), "next").take().release()
            break
        except ValidationError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)

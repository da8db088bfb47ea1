"""Long copies (issue 31): a control-machine file pushed over a real SSH connection (OpenSSH sshd on
loopback, paramiko through Fabric's client) in chunks, continued from what the host holds, under a
bandwidth limit, with progress lines; the pacing and the progress arithmetic with a fake clock; a host's
own download watched for progress."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from pdfleet.ops import transfer
from pdfleet.ops.base import Push, Run, Watch
from pdfleet.ops.runner import execute
from pdfleet.ops.ssh import LocalTransport, SshTransport, open_connection
from pdfleet.ops.transfer import (
    CHUNK,
    Meter,
    TransferError,
    duration,
    progress_line,
    push,
    rate_bytes,
    throttled,
)
from tests.unit.helpers import Sshd
from tests.unit.ops.helpers import ssh_host

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py

MIB = 1 << 20


class FakeClock:
    """Time that moves only when slept."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_progress_lines_say_bytes_percent_rate_and_eta() -> None:
    line = progress_line("model.safetensors", 3 * MIB, 12 * MIB, 2 * MIB, 2.0)
    assert line == "model.safetensors: 3.0 MiB of 12.0 MiB (25%), 1.0 MiB/s, ETA 9s"
    assert progress_line("x", 0, 10, 0, 0.0).endswith("0 B/s, ETA unknown")
    assert [duration(s) for s in (41, 125, 3725)] == ["41s", "2m05s", "1h02m"]
    assert [rate_bytes(v) for v in ("500", "20K", "20M", "1G")] == [500, 20 << 10, 20 << 20, 1 << 30]


def test_the_meter_speaks_at_most_every_interval() -> None:
    clock, lines = FakeClock(), []
    meter = Meter("f", 100, 10, lines.append, every=5, clock=clock)
    for done in (20, 30):
        clock.now += 2
        meter.update(done)
    assert lines == []
    clock.now += 2  # 6 s in
    meter.update(40)
    assert lines == ["f: 40 B of 100 B (40%), 5 B/s, ETA 12s"]  # 30 new bytes (10 were there) in 6 s


def test_a_limited_push_is_paced_in_small_chunks_and_never_read_whole() -> None:
    clock, counts = FakeClock(), []
    data = os.urandom(3 * MIB + 5)
    chunks = list(throttled(io.BytesIO(data), len(data), MIB, counts.append, clock, clock.sleep))
    assert b"".join(chunks) == data and max(len(c) for c in chunks) == MIB // 8
    assert clock.now == pytest.approx(len(data) / MIB)  # 1 MiB/s on average, never ahead of it
    assert counts[-1] == len(data)
    unlimited = list(throttled(io.BytesIO(data), len(data), None, counts.append, clock, clock.sleep))
    assert max(len(c) for c in unlimited) == CHUNK
    with pytest.raises(TransferError, match="ended after 5 of 9 bytes"):
        list(throttled(io.BytesIO(b"12345"), 9, None, counts.append, clock, clock.sleep))


@pytest.fixture
def ssh(sshd: Sshd) -> Iterator[SshTransport]:
    transport = open_connection(ssh_host(sshd), "~/.ssh/known_hosts", 5)
    try:
        yield transport
    finally:
        transport.close()


@pytest.mark.sshd
@pytest.mark.timeout(60)
def test_a_push_over_ssh_continues_from_what_the_host_holds_under_the_limit(
    ssh: SshTransport, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transfer, "PROGRESS_EVERY_S", 0.3)
    source = tmp_path / "shard.safetensors"
    data = os.urandom(3 * MIB)
    source.write_bytes(data)
    dest = tmp_path / "host" / "shard.safetensors.part"
    dest.parent.mkdir()
    lines: list[str] = []
    out = push(ssh, Push(str(source), str(dest), len(data), "shard"), 30, lines.append)
    assert out.rc == 0 and dest.read_bytes() == data

    # an interrupted push: the host holds a first MiB (zeros here, so what was sent shows) -> only the rest
    dest.write_bytes(b"\0" * MIB)
    out = push(ssh, Push(str(source), str(dest), len(data), "shard", limit=2 * MIB), 30, lines.append)
    assert out.rc == 0 and dest.read_bytes() == b"\0" * MIB + data[MIB:]
    # 2 MiB at 2 MiB/s: about a second, reported on the way with the resumed part counted as done
    assert lines and all(line.startswith("shard: ") and " of 3.0 MiB (" in line for line in lines)
    assert all(int(line.split("(")[1].split("%")[0]) >= 33 for line in lines)

    # longer than the file: not a prefix, sent again from the start; complete: nothing sent
    dest.write_bytes(data + b"x")
    assert push(ssh, Push(str(source), str(dest), len(data), "shard"), 30).rc == 0
    assert dest.read_bytes() == data
    source.write_bytes(b"")  # a file the run no longer has: the push must not touch the host
    with pytest.raises(TransferError, match=r"holds 0 bytes, its manifest says 3145728"):
        push(ssh, Push(str(source), str(dest), len(data), "shard"), 30)


@pytest.mark.sshd
@pytest.mark.timeout(60)
def test_a_failing_receiver_is_a_command_error_with_its_stderr(ssh: SshTransport, tmp_path: Path) -> None:
    source = tmp_path / "f"
    source.write_bytes(os.urandom(2 * MIB))
    missing_dir = tmp_path / "no" / "f.part"
    with pytest.raises(Exception, match=r"push .* exited 1: .*No such file or directory"):
        execute(ssh, Push(str(source), str(missing_dir), 2 * MIB, "f"), 30)
    out = LocalTransport().send(f"cat > {tmp_path / 'local'}", iter([b"ab", b"cd"]))
    assert out.rc == 0 and (tmp_path / "local").read_bytes() == b"abcd"


def test_a_watched_download_reports_its_growing_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transfer, "PROGRESS_EVERY_S", 0.2)
    part = tmp_path / "f.part"
    grow = f"for i in 1 2 3 4 5 6; do head -c 1000 /dev/zero >> {part}; sleep 0.2; done"
    lines: list[str] = []
    execute(LocalTransport(), Run(grow, sudo=False, watch=Watch(str(part), 10_000, "f")), 30, lines.append)
    assert lines and all(line.startswith("f: ") and " of 9.8 KiB (" in line for line in lines)
    assert part.stat().st_size == 6000


@pytest.mark.sshd
@pytest.mark.timeout(60)
def test_a_watched_download_over_ssh_is_read_on_a_second_channel(
    ssh: SshTransport, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The poller asks the same connection while the command still runs on it."""
    monkeypatch.setattr(transfer, "PROGRESS_EVERY_S", 0.2)
    part = tmp_path / "g.part"
    grow = f"for i in 1 2 3 4 5 6; do head -c 1000 /dev/zero >> {part}; sleep 0.2; done; echo done"
    lines: list[str] = []
    execute(ssh, Run(grow, watch=Watch(str(part), 10_000, "g", start=0)), 30, lines.append)
    assert lines and all(line.startswith("g: ") and " of 9.8 KiB (" in line for line in lines)
    assert part.stat().st_size == 6000

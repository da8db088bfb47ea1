"""Long copies to a host: a control-machine file pushed over the SSH connection (resumed from what the host
already holds, at most a bandwidth limit, in chunks, never whole in memory), and progress within a file
(bytes, percent, rate, ETA) for pushes and for downloads the host runs itself (a watched `.part` file).

Progress lines go through the runner's per-host callback every PROGRESS_EVERY_S, like its other lines.
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from pdfleet.errors import PdfleetError
from pdfleet.ops.base import Push, Run
from pdfleet.ops.ssh import Output, Transport

q = shlex.quote
CHUNK = 1 << 20  # what a push holds in memory at a time
MIN_CHUNK = 16 << 10
PROGRESS_EVERY_S = 10.0
Emit = Callable[[str], None]
RATE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}  # curl's --limit-rate suffixes


class TransferError(PdfleetError):
    """The control machine's file is not the one the plan was made for (missing, or another size)."""


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB': sizes in progress lines and refusals."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def rate_bytes(limit: str) -> int:
    """A bandwidth limit as curl's --limit-rate reads it ('20M' -> 20 MiB/s) in bytes per second."""
    suffix = limit[-1:].upper() if limit[-1:].isalpha() else ""
    return int(limit[: len(limit) - len(suffix)]) * RATE_UNITS[suffix]


def duration(seconds: float) -> str:
    """41 -> '41s', 125 -> '2m05s', 3725 -> '1h02m': an ETA."""
    s = int(seconds + 0.5)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def progress_line(label: str, done: int, total: int, moved: int, elapsed: float) -> str:
    """`label: 1.2 GiB of 4.6 GiB (26%), 85.0 MiB/s, ETA 41s`; the rate counts only the bytes this copy
    moved (`moved`, a resumed copy's earlier part excluded)."""
    percent = 100 * done // total if total else 100
    rate = moved / elapsed if elapsed > 0 else 0.0
    eta = f"ETA {duration((total - done) / rate)}" if rate > 0 else "ETA unknown"
    return f"{label}: {human_bytes(done)} of {human_bytes(total)} ({percent}%), {human_bytes(rate)}/s, {eta}"


class Meter:
    """Turns a copy's byte count into a progress line at most every `every` seconds."""

    def __init__(
        self,
        label: str,
        total: int,
        start: int,
        emit: Emit,
        every: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._label, self._total, self._start, self._emit = label, total, start, emit
        self._every = PROGRESS_EVERY_S if every is None else every
        self._clock = clock
        self._t0 = self._last = clock()

    def update(self, done: int) -> None:
        """Report `done` bytes of the total when a line is due."""
        now = self._clock()
        if now - self._last >= self._every:
            self._last = now
            self._emit(progress_line(self._label, done, self._total, done - self._start, now - self._t0))


def throttled(
    fh: BinaryIO,
    length: int,
    limit: int | None,
    on_sent: Callable[[int], None],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[bytes]:
    """`length` bytes of `fh` from where it stands, in chunks of at most CHUNK, paced so the average rate
    stays under `limit` bytes/s (smaller chunks under a low limit keep the pace even); `on_sent` gets the
    running count after each chunk."""
    size = CHUNK if limit is None else max(MIN_CHUNK, min(CHUNK, limit // 8))
    sent, t0 = 0, clock()
    while sent < length:
        data = fh.read(min(size, length - sent))
        if not data:
            raise TransferError(f"{getattr(fh, 'name', 'the file')} ended after {sent} of {length} bytes")
        yield data
        sent += len(data)
        on_sent(sent)
        if limit:
            ahead = sent / limit - (clock() - t0)
            if ahead > 0:
                sleep(ahead)


def _remote_size(transport: Transport, path: str, timeout: float | None) -> int:
    """The size of `path` on the host (0 when absent)."""
    out = transport.run(f"stat -c %s -- {q(path)} 2>/dev/null || echo 0", sudo=True, timeout=timeout)
    try:
        return int(out.stdout.strip() or "0") if out.rc == 0 else 0
    except ValueError:
        return 0


def push(transport: Transport, cmd: Push, timeout: float | None, emit: Emit | None = None) -> Output:
    """Append what `cmd.dest` lacks of `cmd.source` (see Push); a longer `dest` is not a prefix of the file
    and starts over. The control machine's file must still have the size the plan read."""
    source = Path(cmd.source)
    try:
        local_size = source.stat().st_size
    except OSError as exc:
        raise TransferError(f"cannot read {source} on the control machine: {exc.strerror}") from None
    if local_size != cmd.size:
        raise TransferError(
            f"{source} on the control machine holds {local_size} bytes, its manifest says {cmd.size}: "
            "the mirror changed under the run"
        )
    offset = _remote_size(transport, cmd.dest, timeout)
    if offset > cmd.size:
        offset = 0
    if offset == cmd.size:
        return Output(0, "", "")
    meter = Meter(cmd.label, cmd.size, offset, emit or (lambda _: None))
    redirect = ">" if offset == 0 else ">>"
    with source.open("rb") as fh:
        fh.seek(offset)
        chunks = throttled(fh, cmd.size - offset, cmd.limit, lambda n: meter.update(offset + n))
        return transport.send(f"cat {redirect} {q(cmd.dest)}", chunks, sudo=True, timeout=timeout)


def watched_run(transport: Transport, cmd: Run, timeout: float | None, emit: Emit) -> Output:
    """Run `cmd` while another channel reads the size of its watched file every PROGRESS_EVERY_S and
    reports it (the command's own output only comes back when it ends); a command done sooner costs no
    extra round trip."""
    assert cmd.watch is not None
    watch = cmd.watch
    done = threading.Event()

    def poll() -> None:
        meter = Meter(watch.label, watch.total, watch.start, emit, every=0)
        while not done.wait(PROGRESS_EVERY_S):
            size = _remote_size(transport, watch.path, 30)
            if not done.is_set() and 0 < size < watch.total:
                meter.update(size)

    poller = threading.Thread(target=poll, name="pdfleet-progress", daemon=True)
    poller.start()
    try:
        return transport.run(cmd.cmd, sudo=cmd.sudo, timeout=timeout)
    finally:
        done.set()
        poller.join(timeout=35)

"""Host-side plumbing for the lab: preflight checks, running commands, and tracking our processes."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from pdfleet.errors import PdfleetError

Progress = Callable[[str], None]

# tool -> the Debian package that provides it (named in the error so the fix is one command)
REQUIRED_TOOLS: dict[str, str] = {
    "systemd-nspawn": "systemd-container",
    "debootstrap": "debootstrap",
    "dpkg-scanpackages": "dpkg-dev",
    "ip": "iproute2",
    "mount": "mount",
    "apt-get": "apt",
    "ssh": "openssh-client",
}


class LabError(PdfleetError):
    """The lab cannot be brought up or down as asked; the message names the fix."""


def quiet_progress(_: str) -> None:
    """A Progress that says nothing (tests, library callers)."""


def preflight(tools: Sequence[str] = tuple(REQUIRED_TOOLS)) -> None:
    """Fail early, with the fix, when this machine cannot run the lab: not Linux, not root, tool missing."""
    if not sys.platform.startswith("linux"):
        raise LabError(f"the lab needs Linux (systemd-nspawn containers); this is {sys.platform}.")
    if os.geteuid() != 0:
        raise LabError(
            "the lab needs root (it creates a bridge, overlay mounts and containers, and its "
            "state under /var/lib/pdfleet-lab is root's); run the task as root, e.g. with sudo."
        )
    missing = sorted({REQUIRED_TOOLS.get(t, t) for t in tools if shutil.which(t) is None})
    if missing:
        fix = f"apt-get install -y {' '.join(missing)}"
        raise LabError(f"missing tools for the lab; install them with `{fix}`.")
    if "overlay" not in Path("/proc/filesystems").read_text():
        raise LabError("the kernel has no overlay filesystem; load it with `modprobe overlay`.")


LOCK_FILE = Path("/run/pdfleet-lab.lock")


@contextlib.contextmanager
def exclusive(progress: Progress, lock_file: Path = LOCK_FILE, timeout: float = 900.0) -> Iterator[None]:
    """Hold the lab lock: one lab.up/lab.down at a time on this machine (others wait their turn)."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with lock_file.open("a") as handle:
        deadline = time.monotonic() + timeout
        told = False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise LabError(
                        f"another lab.up or lab.down has held {lock_file} for {timeout:.0f} s; "
                        "wait for it to finish."
                    ) from None
                if not told:
                    progress("waiting for another lab.up or lab.down to finish")
                    told = True
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run(
    cmd: Sequence[str],
    *,
    check: bool = True,
    input_text: str | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command, capturing output; a failure becomes a LabError quoting its stderr."""
    proc = subprocess.run(list(cmd), capture_output=True, text=True, input=input_text, env=env, cwd=cwd)
    if check and proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-15:]
        raise LabError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}):\n" + "\n".join(tail))
    return proc


def run_streaming(
    cmd: Sequence[str],
    label: str,
    progress: Progress,
    log_path: Path,
    env: dict[str, str] | None = None,
    every: float = 3.0,
) -> None:
    """Run a long command, logging all output to a file and reporting its latest line now and then."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = last = time.monotonic()
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            list(cmd),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            stdin=subprocess.DEVNULL,
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            now = time.monotonic()
            if line.strip() and not line.startswith("WARNING:") and now - last >= every:
                last = now
                progress(f"{label} [{now - start:4.0f}s] {line.strip()[:100]}")
        rc = proc.wait()
    if rc != 0:
        tail = log_path.read_text().strip().splitlines()[-15:]
        raise LabError(f"{label} failed (exit {rc}); full log in {log_path}:\n" + "\n".join(tail))


@dataclass(frozen=True)
class ProcessRef:
    """A process we started, pinned by its start time so a recycled PID is never mistaken for it."""

    pid: int
    start_time: int

    @classmethod
    def of(cls, pid: int) -> ProcessRef | None:
        """The live process with this PID, or None."""
        start = _start_time(pid)
        return None if start is None else cls(pid, start)

    def alive(self) -> bool:
        """Whether this very process still exists (and is not a zombie)."""
        return _start_time(self.pid) == self.start_time and not _is_zombie(self.pid)

    def to_json(self) -> list[int]:
        return [self.pid, self.start_time]

    @classmethod
    def from_json(cls, data: object) -> ProcessRef | None:
        if isinstance(data, list) and len(data) == 2 and all(isinstance(x, int) for x in data):
            return cls(data[0], data[1])
        return None

    def send(self, sig: int) -> None:
        """Send a signal if the process is still ours."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def stop(self, timeout: float, first: int = signal.SIGTERM) -> None:
        """Ask the process to stop, then kill it once the timeout has passed."""
        self.send(first)
        if not self.wait_gone(timeout):
            self.send(signal.SIGKILL)
            self.wait_gone(5.0)

    def wait_gone(self, timeout: float) -> bool:
        """Wait until the process has exited; reap it if it is our child."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, os.WNOHANG)
            if not self.alive():
                return True
            time.sleep(0.05)
        return not self.alive()


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name may contain spaces and parentheses; fields resume after the last ')'.
    return raw[raw.rfind(")") + 2 :].split()


def _start_time(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[19])


def _is_zombie(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and fields[0] in ("Z", "X")


def children(pid: int) -> list[int]:
    """Direct children of a process."""
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields is not None and int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def namespace_pid(pid: int) -> int | None:
    """The PID a process has inside its innermost PID namespace (1 for a container's init)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def start_detached(cmd: Sequence[str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start a process in its own session, outliving this one, with output to a log file."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        return subprocess.Popen(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )


def is_mounted(path: Path) -> bool:
    """Whether something is mounted exactly at path."""
    target = os.path.realpath(path)
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 1 and fields[1].replace("\\040", " ") == target:
            return True
    return False


def atomic_write(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    """Write a file by rename so a killed run never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    payload = data.encode() if isinstance(data, str) else data
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, payload)
    finally:
        os.close(fd)
    os.chmod(tmp, mode)
    os.replace(tmp, path)

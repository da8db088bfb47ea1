"""Staging weights (issue 31) with the real commands on this machine against a range-answering mirror on
loopback: a fresh copy checked by SHA-256, a converged directory planning nothing, an interrupted copy
continued from its partial file, a corrupt file replaced, a mirror serving wrong bytes refused without
the file taking its name, and a disk too small refused before anything is fetched; and the same pushed from
a control-machine directory over a real SSH connection; and old revision directories removed after the
units restart onto the pin (real units in a private systemd)."""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pdfleet.lab.model_mirror import LAB_MODEL, build_lab_models, make_server
from pdfleet.model.inventory import Host
from pdfleet.model.weights import WeightsManifest
from pdfleet.ops import transfer
from pdfleet.ops.base import Change, FactSource, FakeFacts, Operation, Run
from pdfleet.ops.errors import OperationError
from pdfleet.ops.files import Directory
from pdfleet.ops.gather import HostFacts
from pdfleet.ops.runner import CommandError, RunOptions, execute, run_fleet
from pdfleet.ops.ssh import LocalTransport, open_connection
from pdfleet.ops.systemd import SystemdUnit, restart_handler
from pdfleet.ops.transfer import human_bytes
from pdfleet.ops.weights import (
    OldRevisions,
    PushFile,
    RevisionDirs,
    StagedFiles,
    StagedState,
    StageFile,
    WeightsSpace,
    bytes_to_fetch,
)
from tests.unit.helpers import Sshd, UserSystemd
from tests.unit.ops.helpers import ssh_host

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py

REVISION = "lab-r1"


@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, WeightsManifest]]:
    """The lab's model served on 127.0.0.1 (any free port): its URL root, directory and r1 manifest."""
    root = tmp_path_factory.mktemp("mirror")
    manifests = build_lab_models(root)
    server = make_server("127.0.0.1", 0, root)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", root, manifests[0]
    finally:
        server.shutdown()
        server.server_close()


def _ops(base: str, directory: Path, manifest: WeightsManifest) -> list[StageFile]:
    paths = tuple(f.path for f in manifest.files)
    return [
        StageFile(str(directory), f, f"{base}{LAB_MODEL}/{REVISION}/{f.path}", paths) for f in manifest.files
    ]


def _plan_and_apply(ops: list[StageFile], apply: bool = True) -> list[Change]:
    """Plan every op against fresh facts of this machine, then run the planned commands."""
    facts = HostFacts(LocalTransport())
    changes = [c for op in ops for c in op.plan(facts)]
    if apply:
        for change in changes:
            for cmd in change.commands:
                execute(LocalTransport(), cmd, timeout=60)
    return changes


def _shas(directory: Path) -> dict[str, str]:
    return {
        p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in directory.rglob("*")
        if p.is_file()
    }


def test_stage_verify_converge_corrupt_and_resume(
    mirror: tuple[str, Path, WeightsManifest], tmp_path: Path
) -> None:
    base, _, manifest = mirror
    directory = tmp_path / "models" / LAB_MODEL / REVISION
    directory.mkdir(parents=True)
    ops = _ops(base, directory, manifest)
    assert len(_plan_and_apply(ops)) == len(manifest.files)
    assert _shas(directory) == {f.path: f.sha256 for f in manifest.files}  # every file, no .part left
    assert _plan_and_apply(ops) == []  # converged: nothing to fetch

    shard = next(f for f in manifest.files if f.path.endswith(".safetensors"))
    target = directory / shard.path
    data = bytearray(target.read_bytes())
    data[100] ^= 0xFF  # one flipped byte: same size, other checksum
    target.write_bytes(bytes(data))
    (changed,) = _plan_and_apply(ops)
    assert changed.diff.startswith(f"replace {shard.path}: sha256 ")
    assert _shas(directory)[shard.path] == shard.sha256

    # an interrupted copy: the first half of the shard as its .part, the file itself gone
    whole = target.read_bytes()
    target.unlink()
    (directory / f"{shard.path}.part").write_bytes(whole[: len(whole) // 2])
    (changed,) = _plan_and_apply(ops, apply=False)
    assert "continue the partial download at 1.0 MiB" in changed.diff
    (cmd,) = changed.commands
    assert isinstance(cmd, Run) and " -C - " in cmd.cmd
    _plan_and_apply(ops)
    assert _shas(directory) == {f.path: f.sha256 for f in manifest.files}


def test_a_partial_file_is_continued_not_fetched_again(
    mirror: tuple[str, Path, WeightsManifest], tmp_path: Path
) -> None:
    """The .part's first half is kept as it is: a wrong first half (not refetched) fails the check, which
    shows curl asked only for the rest; the bad .part is removed so the next run starts over."""
    base, _, manifest = mirror
    directory = tmp_path / "d"
    directory.mkdir()
    shard = next(f for f in manifest.files if f.path.endswith(".safetensors"))
    (directory / f"{shard.path}.part").write_bytes(b"\0" * (shard.size // 2))
    (op,) = [op for op in _ops(base, directory, manifest) if op.file == shard]
    with pytest.raises(CommandError, match=f"{shard.path}: SHA-256 differs from the manifest after download"):
        _plan_and_apply([op])
    assert not (directory / shard.path).exists() and not (directory / f"{shard.path}.part").exists()
    _plan_and_apply([op])
    assert _shas(directory) == {shard.path: shard.sha256}


def test_a_mirror_serving_other_bytes_never_puts_them_in_place(
    mirror: tuple[str, Path, WeightsManifest], tmp_path: Path
) -> None:
    base, root, manifest = mirror
    directory = tmp_path / "d"
    directory.mkdir()
    config = next(f for f in manifest.files if f.path == "config.json")
    other = root / "other.json"
    other.write_text("{}\n")
    op = StageFile(str(directory), config, f"{base}other.json", (config.path,))
    with pytest.raises(CommandError, match="config.json: SHA-256 differs from the manifest"):
        _plan_and_apply([op])
    assert list(directory.iterdir()) == []
    missing = StageFile(str(directory), config, f"{base}no-such-file", (config.path,))
    with pytest.raises(CommandError, match="404"):
        _plan_and_apply([missing])


def test_the_fact_reads_shas_partials_and_free_space_in_one_command(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "a").write_bytes(b"a")
    (tmp_path / "sub" / "b.part").write_bytes(b"123")
    fact = StagedFiles(str(tmp_path), ("a", "sub/b", "c"))
    state = HostFacts(LocalTransport()).get(fact)
    assert state.sha256 == {"a": hashlib.sha256(b"a").hexdigest()}
    assert state.partial == {"sub/b": 3} and state.free_bytes > 0
    absent = HostFacts(LocalTransport()).get(StagedFiles(str(tmp_path / "x" / "y"), ("a",)))
    assert absent.sha256 == {} and absent.free_bytes > 0  # the nearest existing parent's filesystem


def test_a_disk_too_small_is_refused_before_any_download(mirror: tuple[str, Path, WeightsManifest]) -> None:
    _, _, manifest = mirror
    shard = next(f for f in manifest.files if f.path.endswith(".safetensors"))
    fact = StagedFiles("/d", tuple(f.path for f in manifest.files))
    need = bytes_to_fetch(manifest, StagedState({}, {shard.path: 1000}, 0))
    assert need == manifest.total_bytes - 1000  # a partial file counts for what it already holds
    space = WeightsSpace("/d", manifest)
    tight = FakeFacts({fact: StagedState({}, {shard.path: 1000}, need - 1)})
    with pytest.raises(
        OperationError, match=r"needs 4\.0 MiB more in /d but its filesystem has 4\.0 MiB free"
    ):
        space.plan(tight)
    assert space.plan(FakeFacts({fact: StagedState({}, {shard.path: 1000}, need)})) == []
    staged = {f.path: f.sha256 for f in manifest.files}
    assert space.plan(FakeFacts({fact: StagedState(staged, {}, 0)})) == []  # converged: nothing needed


def test_a_mirror_without_byte_ranges_starts_a_partial_file_over(
    mirror: tuple[str, Path, WeightsManifest], tmp_path: Path
) -> None:
    """python -m http.server answers no Range: curl exits 33 on the partial file, which is fetched whole."""
    _, root, manifest = mirror
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}/"
        directory = tmp_path / "d"
        directory.mkdir()
        shard = next(f for f in manifest.files if f.path.endswith(".safetensors"))
        (directory / f"{shard.path}.part").write_bytes(b"\0" * 100)
        (op,) = [op for op in _ops(base, directory, manifest) if op.file == shard]
        _plan_and_apply([op])
        assert _shas(directory) == {shard.path: shard.sha256}
    finally:
        server.shutdown()
        server.server_close()


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        return


@pytest.mark.sshd
@pytest.mark.timeout(120)
def test_a_control_machine_directory_is_pushed_over_ssh_checked_and_continued(
    sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PushFile through the runner over the real SSH connection: a fresh copy checked by SHA-256, a
    converged host pushing nothing, a flipped byte replaced, half a shard continued with progress lines."""
    monkeypatch.setattr(transfer, "PROGRESS_EVERY_S", 0.2)
    manifest = build_lab_models(tmp_path / "mirror")[0]
    source = tmp_path / "mirror" / LAB_MODEL / REVISION
    directory = tmp_path / "host" / LAB_MODEL / REVISION
    paths = tuple(f.path for f in manifest.files)
    shard = next(f for f in manifest.files if f.path.endswith(".safetensors"))

    def planner(host: Host, facts: FactSource) -> Iterator[Operation]:
        yield WeightsSpace(str(directory), manifest)
        yield Directory(str(directory), mode="0755")
        for f in manifest.files:
            limit = "4M" if f == shard else None  # a second or so: long enough for progress lines
            yield PushFile(str(directory), f, str(source / f.path), paths, limit=limit)

    lines: list[str] = []

    def run() -> dict[str, str]:
        report = run_fleet([ssh_host(sshd)], planner, RunOptions(), progress=lambda _, m: lines.append(m))
        host = report.hosts["loop"]
        assert host.error is None, host.error
        return {c["op"].rsplit("/", 1)[1].split(" (")[0]: c["diff"] for c in host.changes}

    assert set(run()) == {f.path for f in manifest.files} | {REVISION}  # every file, and the directory
    assert _shas(directory) == {f.path: f.sha256 for f in manifest.files}  # no .part left
    assert run() == {}

    target = directory / shard.path
    data = bytearray(target.read_bytes())
    data[100] ^= 0xFF
    target.write_bytes(bytes(data))
    assert run()[shard.path].startswith(f"replace {shard.path}: sha256 ")
    whole = target.read_bytes()
    target.unlink()
    (directory / f"{shard.path}.part").write_bytes(whole[: len(whole) // 2])
    lines.clear()
    assert "continue the partial download at 1.0 MiB" in run()[shard.path]
    assert _shas(directory) == {f.path: f.sha256 for f in manifest.files}
    progress = [m for m in lines if m.startswith(f"{shard.path}: ")]
    assert progress and all(int(m.split("(")[1].split("%")[0]) >= 50 for m in progress)  # from the half


UNIT = "[Service]\nExecStart=/usr/bin/tail -f {path}\n"


@pytest.mark.sshd
@pytest.mark.systemd
@pytest.mark.timeout(120)
def test_old_revisions_go_after_the_units_restart_onto_the_pin(
    systemd: UserSystemd, systemd_sshd: Sshd, tmp_path: Path
) -> None:
    """Real units in a private systemd, reached over SSH: vllm-t loads r1 and moves to the pin r2 in this
    run, so r1 goes after its restart; r0, loaded by a unit this run does not restart, stays."""
    root = tmp_path / "models" / "org" / "m"
    for revision, size in (("r0", 100), ("r1", 3000), ("r2", 10)):
        (root / revision).mkdir(parents=True)
        (root / revision / "config.json").write_bytes(b"x" * size)
    units = systemd.units_dir
    for name, revision in (("vllm-t.service", "r1"), ("vllm-other.service", "r0")):
        (units / name).write_text(UNIT.format(path=root / revision / "config.json"))
    env = {**os.environ, **systemd.env}
    subprocess.run(["systemctl", "daemon-reload"], env=env, check=True)
    subprocess.run(["systemctl", "start", "vllm-t.service", "vllm-other.service"], env=env, check=True)
    restart = restart_handler("vllm-t.service")
    size = human_bytes(sum(p.stat().st_size for p in (root / "r1", root / "r1" / "config.json")))  # du -sb
    pinned = UNIT.format(path=root / "r2" / "config.json")

    def planner(host: Host, facts: FactSource) -> Iterator[Operation]:
        yield SystemdUnit("vllm-t.service", pinned, restart=restart, directory=str(units))
        yield OldRevisions(str(root), "r2", (restart,))

    lines: list[str] = []
    try:
        report = run_fleet([ssh_host(systemd_sshd)], planner, RunOptions(), lambda _, m: lines.append(m))
        host = report.hosts["loop"]
        assert host.error is None, host.error
        (diff,) = [c["diff"] for c in host.changes if c["op"] == f"old revisions in {root}"]
        assert diff == (
            f"remove r1 ({size}) from {root} once this host's changes succeeded, after "
            "restarting vllm-t.service onto r2; keep r0 (loaded by vllm-other.service)"
        )
        ran = [m for m in lines if m.startswith("running handler")]
        assert ran == [
            "running handler daemon-reload",
            "running handler restart vllm-t.service",
            f"running handler remove old weights r1 ({size}) from {root}",
        ], lines
        assert sorted(p.name for p in root.iterdir()) == ["r0", "r2"]
        transport = open_connection(ssh_host(systemd_sshd), "~/.ssh/known_hosts", 5)
        try:
            use = HostFacts(transport).get(RevisionDirs(str(root)))
        finally:
            transport.close()
        assert use.users == {"r0": {"vllm-other.service"}, "r2": {"vllm-t.service"}}  # moved onto the pin
        assert set(use.sizes) == {"r0", "r2"}
        again = run_fleet([ssh_host(systemd_sshd)], planner, RunOptions())
        assert again.hosts["loop"].changed == 0  # r0 still loaded elsewhere: nothing to do
    finally:
        subprocess.run(["systemctl", "stop", "vllm-t.service", "vllm-other.service"], env=env, check=False)

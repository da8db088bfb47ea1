"""Staged weights in the lab (issue 31), on the provisioned lab: lab-weights stages the lab model's lab-r1
from the lab's model mirror on every pool host, checked by SHA-256, and every pool host's simulator is
started from the staged directory and logs the config.json and tokenizer.json it read there; on lab-d1
a byte flipped in one shard and the other shard's bytes in its place: `invoke verify` finds the corrupted
file, `invoke doctor --profile` names the host and the swapped file, and the second provision restores
both, changing nothing else on any host; an interrupted copy (half a shard left as its .part) continues
with a range request; lab-r2 pushed from the control machine's directory replaces lab-r1 (removed once
converged); a decode pool pinned to another revision is refused. lab-cross is owed back at the end
(tests/lab/conftest.py: SWITCHING). It checks states and files, not latencies."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from pdfleet.lab.mirrors import refresh_host_wheel
from pdfleet.lab.model_mirror import LAB_MODEL, build_lab_models
from pdfleet.model.weights import WeightsManifest
from tests.lab.helpers import REPO_ROOT, LabCrossOwed, LabHandle

INVOKE = [sys.executable, "-m", "invoke"]
PROFILE = "lab-weights"
POOL_HOSTS = ("lab-p1", "lab-d1", "lab-colo1", "lab-colo2")
DIR = f"/var/lib/pdfleet/models/{LAB_MODEL}/lab-r1"
T = TypeVar("T")


def _each(hosts: tuple[str, ...], read: Callable[[str], T]) -> dict[str, T]:
    """`read(host)` for every host at once (independent SSH reads: one round trip's wait, not four)."""
    with ThreadPoolExecutor(len(hosts)) as pool:
        return dict(zip(hosts, pool.map(read, hosts), strict=True))


def _invoke(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*INVOKE, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)


def _provision(profile: str, report: Path, *extra: str) -> dict:
    """Provision through the real CLI and insist every host succeeded; the JSON report."""
    proc = _invoke("provision", "--profile", profile, "--json", str(report), *extra)
    assert proc.returncode == 0 and report.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(report.read_text())


def _staged(lab: LabHandle, host: str, directory: str = DIR) -> dict[str, str] | None:
    """path -> sha256 of the files in a staged directory on a lab host (partial downloads included); None
    when the directory is absent."""
    found = next(h for h in lab.hosts if h.name == host)
    # /var/lib/pdfleet is the service user's: only root walks into it
    rc, out, err = lab.ssh(
        found,
        f"sudo sh -c '[ -d {directory} ] || exit 3; cd {directory} && "
        "find . -type f -print0 | sort -z | xargs -0 sha256sum'",
    )
    if rc == 3:
        return None
    assert rc == 0, err
    return {line.split("  ", 1)[1].removeprefix("./"): line.split()[0] for line in out.splitlines()}


def _host(lab: LabHandle, name: str):  # type: ignore[no-untyped-def]
    return next(h for h in lab.hosts if h.name == name)


def _journal(lab: LabHandle, host: str, since: int) -> str:
    """The host's vLLM units' log lines since `since` (epoch seconds)."""
    rc, journal, err = lab.ssh(
        _host(lab, host), f"sudo journalctl -u 'vllm-*' --since @{since} -o cat --no-pager"
    )
    assert rc == 0, err
    return journal


def _on(lab: LabHandle, host: str, command: str) -> None:
    """Run a shell command as root in the staged directory of a lab host."""
    found = next(h for h in lab.hosts if h.name == host)
    rc, _, err = lab.ssh(found, f"sudo sh -c {shlex.quote(f'cd {DIR} && {command}')}")
    assert rc == 0, err


def test_weights_staged_verified_restored_resumed_and_named(
    lab: LabHandle, lab_cross_owed: LabCrossOwed, tmp_path: Path
) -> None:
    refresh_host_wheel(lab.paths)
    build_lab_models(lab.paths.models_dir)  # the lab model of these sources (a no-op when lab.up made it)
    manifest = WeightsManifest.model_validate_json(
        (lab.paths.models_dir / LAB_MODEL / "lab-r1" / "manifest.json").read_text()
    )
    want = {f.path: f.sha256 for f in manifest.files}
    names = tuple(h.name for h in lab.hosts)
    cleared = _each(names, lambda n: lab.ssh(_host(lab, n), "sudo rm -rf /var/lib/pdfleet/models")[0])
    assert set(cleared.values()) == {0}, cleared  # from nothing, whatever an earlier session left
    lab_cross_owed.owed = True  # lab-cross back before the next test sharing it (conftest: SWITCHING)
    since = int(time.time())
    first = _provision(PROFILE, tmp_path / "first.json")
    staged = _each(POOL_HOSTS, lambda host: _staged(lab, host))
    journals = _each(POOL_HOSTS, lambda host: _journal(lab, host, since))
    for host in POOL_HOSTS:
        fetched = [c for c in first["hosts"][host]["changes"] if c["op"].startswith(f"weights {DIR}/")]
        assert len(fetched) == len(want), (host, fetched)
        assert staged[host] == want, host
        # the simulator was started from the staged directory and read its config and tokenizer there
        read = [line for line in journals[host].splitlines() if f"model config {DIR}/config.json" in line]
        assert read and "(LlamaForCausalLM, max_position_embeddings: max_model_len 131072)" in read[-1], (
            host,
            journals[host][-2000:],
        )
        assert f"tokenizer {DIR}/tokenizer.json (BPE, 346 tokens)" in read[-1], read[-1]
    assert not [c for c in first["hosts"]["lab-gw"]["changes"] if c["op"].startswith("weights ")]

    shards = [f for f in manifest.files if f.path.endswith(".safetensors")]
    shard, other = shards[0], shards[1]
    # on lab-d1 at once: the shards swapped (shard holds other's bytes) and a byte flipped in other. verify
    # names lab-d1 and the corrupted file; doctor names lab-d1 and the swapped file; one provision puts the
    # manifest's bytes back in both
    _on(
        lab,
        "lab-d1",
        f"cp {other.path} {shard.path} && "
        f"printf X | dd of={other.path} bs=1 seek=1000 conv=notrunc status=none",
    )
    bad = _invoke("verify", "--profile", PROFILE, "--checks", "staged_weights")
    flat = " ".join(bad.stdout.split())
    assert bad.returncode != 0 and "FAIL lab-d1 weights/staged_weights_match_manifest" in flat, flat
    assert f"{DIR}/{other.path}:sha256" in "".join(bad.stdout.split()), bad.stdout[-2000:]
    assert "FAIL lab-p1" not in flat
    proc = _invoke("doctor", "--profile", PROFILE, "--minutes", "1", "--json", timeout=180)
    doc = json.loads(proc.stdout)
    found = [f for f in doc["findings"] if f["rule"] == "weights.files"]
    assert [f["subject"] for f in found] == ["lab-d1"], doc["findings"]
    assert f"{shard.path}: sha256 {other.sha256[:12]}, expected {shard.sha256[:12]}" in found[0]["evidence"]
    assert proc.returncode != 0
    # the second provision: every other host changes nothing, and lab-d1 only the two shards
    repaired = _provision(PROFILE, tmp_path / "repair.json")
    changed = {h for h, v in repaired["hosts"].items() if v["changed"]}
    assert changed == {"lab-d1"}, changed
    ops = [c["op"] for c in repaired["hosts"]["lab-d1"]["changes"]]
    assert ops and all(
        op.startswith((f"weights {DIR}/{shard.path}", f"weights {DIR}/{other.path}")) for op in ops
    ), ops
    assert _staged(lab, "lab-d1") == want
    assert _invoke("verify", "--profile", PROFILE, "--checks", "staged_weights").returncode == 0

    # an interrupted copy: half the shard as its .part, the file gone; provision continues it (206)
    log = lab.paths.run_dir / "models-mirror.log"
    before = log.read_text().count(" 206 ") if log.exists() else 0
    half = shard.size // 2
    _on(
        lab,
        "lab-d1",
        f"head -c {half} {shard.path} > {shard.path}.part && rm {shard.path}",
    )
    resumed = _provision(PROFILE, tmp_path / "resume.json", "--limit", "lab-d1", "--roles", "weights")
    diffs = [c["diff"] for c in resumed["hosts"]["lab-d1"]["changes"]]
    assert any("continue the partial download at 1.0 MiB" in d for d in diffs), diffs
    assert log.read_text().count(" 206 ") == before + 1  # one range request: the rest of the shard
    assert _staged(lab, "lab-d1") == want

    # lab-r2 pushed from the control machine (the lab's model directory, over each host's SSH connection
    # through its login user's sudo); lab-r1 removed once the host converged, its size in the diff
    r2 = WeightsManifest.model_validate_json(
        (lab.paths.models_dir / LAB_MODEL / "lab-r2" / "manifest.json").read_text()
    )
    (tmp_path / "pushed.yml").write_text(
        f"extends: {PROFILE}\nmodel: {{source: {lab.paths.models_dir}, revision: lab-r2}}\n"
    )
    pushed = _provision(str(tmp_path / "pushed.yml"), tmp_path / "pushed.json")
    r2_staged = _each(POOL_HOSTS, lambda host: _staged(lab, host, DIR.replace("lab-r1", "lab-r2")))
    r1_staged = _each(POOL_HOSTS, lambda host: _staged(lab, host))
    for host in POOL_HOSTS:
        assert r2_staged[host] == {f.path: f.sha256 for f in r2.files}, host
        assert r1_staged[host] is None, host
        diffs = [c["diff"] for c in pushed["hosts"][host]["changes"] if c["op"].startswith("old revisions")]
        assert len(diffs) == 1 and diffs[0].startswith("remove lab-r1 ("), diffs


def test_a_decode_pool_pinned_to_another_revision_is_refused(tmp_path: Path) -> None:
    """No lab host is touched: the profile is refused before provision connects."""
    (tmp_path / "pinned.yml").write_text(
        f"extends: {PROFILE}\npools: {{decode: {{extra_args: [--revision, lab-r2]}}}}\n"
    )
    proc = _invoke("provision", "--profile", str(tmp_path / "pinned.yml"), "--check", timeout=120)
    assert proc.returncode != 0
    assert (
        "pools.decode.extra_args[0]: --revision is rendered by pdfleet from model.revision" in proc.stderr
    ), proc.stderr

"""`invoke provision` against the lab: converges, then a second run changes nothing; pools really serve;
drift is repaired touching only what drifted; a dead host or a changed host key fails only that host."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pdfleet.fleet.topology import build_topology
from pdfleet.lab.control import down
from pdfleet.lab.mirrors import refresh_host_wheel
from pdfleet.lab.state import LabState
from pdfleet.model.inventory import load_inventory
from pdfleet.model.profile_loader import load_profile
from pdfleet.model.vllm_release_data import RELEASES
from tests.lab.helpers import REPO_ROOT, LabHandle

INVOKE = [sys.executable, "-m", "invoke"]


def _run_provision(profile: str, inventory: Path, report: Path, *extra: str) -> tuple[int, str, dict]:
    """Run the real CLI (as an operator would): exit code, output, JSON report."""
    proc = subprocess.run(
        [
            *INVOKE,
            "provision",
            "--profile",
            profile,
            "--inventory",
            str(inventory),
            "--json",
            str(report),
            *extra,
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert report.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.returncode, proc.stdout + proc.stderr, json.loads(report.read_text())


def _provision(profile: str, inventory: Path, report: Path, *extra: str) -> dict:
    """Provision and insist it succeeded on every host."""
    rc, _, data = _run_provision(profile, inventory, report, *extra)
    assert rc == 0, json.dumps({h: v.get("error") for h, v in data["hosts"].items()}, indent=1)
    return data


def _bare(lab: LabHandle) -> None:
    """The lab's hosts as `lab.up` boots them: taken down and up again if any was provisioned (~12 s for
    five hosts; the session runs this test right after Molecule's destroy, on hosts booted bare)."""
    if any(lab.ssh(h, "test -e /etc/pdfleet -o -e /opt/pdfleet")[0] == 0 for h in lab.hosts):
        down(lab.lab)
        lab.up()


@pytest.mark.parametrize("profile", ["lab-cross"])
def test_provision_twice_second_run_changes_nothing(lab: LabHandle, tmp_path: Path, profile: str) -> None:
    """From bare hosts: the first run changes every host, the second none; every pool then serves."""
    inventory = lab.lab.inventory
    _bare(lab)
    # The hosts install the host wheel of this clone; provision serves it, this only shows it works alone.
    refresh_host_wheel(lab.paths)
    first = _provision(profile, inventory, tmp_path / "first.json")
    assert first["totals"]["failed"] == 0
    hosts = set(load_inventory(inventory).hosts)
    changed = {h: v["changed"] for h, v in first["hosts"].items()}
    assert set(changed) == hosts and all(n > 0 for n in changed.values()), changed
    second = _provision(profile, inventory, tmp_path / "second.json")
    assert second["totals"]["failed"] == 0
    assert second["totals"]["changed"] == 0, {h: v["changes"] for h, v in second["hosts"].items()}

    prof = load_profile(profile, REPO_ROOT / "profiles")
    inv = load_inventory(inventory)
    served = 0
    topology = build_topology(prof, inv)
    for lab_host in lab.hosts:
        for instance in topology.on_host(lab_host.name):
            check = (
                f"systemctl is-active {instance.unit} && "
                f"curl -fsS -o /dev/null -w '%{{http_code}}' {instance.health_url}"
            )
            rc, out, err = lab.ssh(lab_host, check)
            assert rc == 0, f"{lab_host.name} {instance.unit}: {out} {err}"
            assert out.strip().endswith("200")
            served += 1
    assert served >= 2, "lab-cross runs a prefill and a decode pool"


# The scenarios below share one converged lab-cross fleet and run in file order.
PROFILE = "lab-cross"


def _host(lab: LabHandle, name: str):  # noqa: ANN202 - LabHost
    return next(h for h in lab.hosts if h.name == name)


def _main_pid(lab: LabHandle, host: str, unit: str) -> str:
    rc, out, err = lab.ssh(_host(lab, host), f"systemctl show -p MainPID --value {unit}")
    assert rc == 0, err
    return out.strip()


@pytest.fixture(scope="module")
def converged(lab: LabHandle, tmp_path_factory: pytest.TempPathFactory) -> LabHandle:
    """lab-cross provisioned (in the session, from the lab-same-host fleet the 0.11 test leaves). That it
    then changes nothing is the first test's to say: its --check run plans every host against the facts."""
    _provision(PROFILE, lab.lab.inventory, tmp_path_factory.mktemp("converged") / "a.json")
    return lab


def test_check_on_a_converged_lab_changes_nothing(converged: LabHandle, tmp_path: Path) -> None:
    lab = converged
    stamp = "stat -c %Y /etc/pdfleet/vllm-prefill.env /etc/systemd/system/vllm-prefill.service"
    _, before, _ = lab.ssh(_host(lab, "lab-p1"), stamp)
    data = _provision(PROFILE, lab.lab.inventory, tmp_path / "check.json", "--check")
    assert data["totals"]["changed"] == 0 and data["totals"]["failed"] == 0
    _, after, _ = lab.ssh(_host(lab, "lab-p1"), stamp)
    assert before == after


def test_an_operator_code_edit_changes_nothing_on_a_converged_lab(
    converged: LabHandle, tmp_path: Path
) -> None:
    """Hosts run the host wheel, whose version ignores operator code: a CLI edit restarts no gateway."""
    lab = converged
    pid = _main_pid(lab, "lab-gw", "pdfleet-gateway.service")
    edited = REPO_ROOT / "pdfleet" / "cli" / "render.py"
    original = edited.read_text()
    try:
        edited.write_text(original + "\n# an operator-side edit (tests/lab/test_lab_provision.py)\n")
        data = _provision(PROFILE, lab.lab.inventory, tmp_path / "cli-edit.json")
    finally:
        edited.write_text(original)
    assert data["totals"]["changed"] == 0 and data["totals"]["failed"] == 0, data["hosts"]
    assert _main_pid(lab, "lab-gw", "pdfleet-gateway.service") == pid


def test_hand_edit_is_restored_and_only_that_unit_restarts(converged: LabHandle, tmp_path: Path) -> None:
    lab = converged
    units = {
        "lab-p1": "vllm-prefill.service",
        "lab-d1": "vllm-decode.service",
        "lab-colo1": "vllm-colocated.service",
    }
    pids = {h: _main_pid(lab, h, u) for h, u in units.items()}
    rc, original, _ = lab.ssh(_host(lab, "lab-p1"), "sudo -n cat /etc/pdfleet/vllm-prefill.env")
    assert rc == 0
    edit = "echo VLLM_NIXL_SIDE_CHANNEL_PORT=9999 | sudo -n tee -a /etc/pdfleet/vllm-prefill.env"
    rc, _, err = lab.ssh(_host(lab, "lab-p1"), edit)
    assert rc == 0, err

    data = _provision(PROFILE, lab.lab.inventory, tmp_path / "repair.json")
    assert {h: v["changed"] for h, v in data["hosts"].items() if v["changed"]} == {"lab-p1": 1}
    _, restored, _ = lab.ssh(_host(lab, "lab-p1"), "sudo -n cat /etc/pdfleet/vllm-prefill.env")
    assert restored == original
    assert _main_pid(lab, "lab-p1", units["lab-p1"]) != pids["lab-p1"], "the edited unit restarted"
    for host in ("lab-d1", "lab-colo1"):
        assert _main_pid(lab, host, units[host]) == pids[host], f"{units[host]} on {host} was left alone"


def test_a_stopped_unit_is_started_again(converged: LabHandle, tmp_path: Path) -> None:
    lab = converged
    d1 = _host(lab, "lab-d1")
    rc, _, err = lab.ssh(d1, "sudo -n systemctl stop vllm-decode.service")
    assert rc == 0, err
    data = _provision(PROFILE, lab.lab.inventory, tmp_path / "start.json")
    assert data["hosts"]["lab-d1"]["changed"] >= 1
    rc, out, _ = lab.ssh(
        d1,
        "systemctl is-active vllm-decode.service && "
        "curl -fsS -o /dev/null -w '%{http_code}' http://198.18.0.31:8200/health",
    )
    assert rc == 0 and out.strip().endswith("200"), out


def test_changed_host_key_is_refused_with_the_fix(converged: LabHandle, tmp_path: Path) -> None:
    """A host whose key no longer matches known_hosts is refused, saying how to fix it; others go on.
    A pool host: a gateway host's is refused before anything starts (provision reads the live layout
    from the gateway hosts first)."""
    lab = converged
    key = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    lines = lab.paths.known_hosts.read_text().splitlines()
    forged = [ln for ln in lines if "198.18.0.31" not in ln.split(" ", 1)[0].split(",")]
    forged.append("198.18.0.31 " + " ".join(key.with_suffix(".pub").read_text().split()[:2]))
    known = tmp_path / "known_hosts"
    known.write_text("\n".join(forged) + "\n")
    inventory = tmp_path / "lab.yml"
    inventory.write_text(lab.lab.inventory.read_text().replace(str(lab.paths.known_hosts), str(known)))

    rc, output, data = _run_provision(PROFILE, inventory, tmp_path / "key.json")
    assert rc != 0
    error = data["hosts"]["lab-d1"]["error"] or ""
    assert "changed" in error.lower() and "ssh-keygen -R" in error, error
    assert data["hosts"]["lab-d1"]["failed"] == 1
    assert all(v["failed"] == 0 for h, v in data["hosts"].items() if h != "lab-d1")


def test_a_host_powered_off_mid_fleet_fails_alone_then_rejoins(converged: LabHandle, tmp_path: Path) -> None:
    lab = converged
    rec = LabState.load(lab.paths.state_file).hosts["lab-d1"]
    # The power cord, not a clean shutdown: the container's init and its nspawn die at once.
    for ref in (rec.init, rec.nspawn):
        assert ref is not None
        os.kill(ref.pid, signal.SIGKILL)
    for ref in (rec.init, rec.nspawn):
        ref.wait_gone(10)

    rc, _, data = _run_provision(PROFILE, lab.lab.inventory, tmp_path / "off.json")
    assert rc != 0
    assert data["hosts"]["lab-d1"]["failed"] == 1 and data["hosts"]["lab-d1"]["error"]
    for host, result in data["hosts"].items():
        if host != "lab-d1":
            assert result["failed"] == 0 and result["changed"] == 0, (host, result)

    lab.up()  # power back on: same disk, units enabled
    data = _provision(PROFILE, lab.lab.inventory, tmp_path / "back.json")
    assert data["totals"]["failed"] == 0
    if data["totals"]["changed"]:  # the units came back with the host's boot: usually nothing to change
        again = _provision(PROFILE, lab.lab.inventory, tmp_path / "again.json")
        assert again["totals"]["changed"] == 0


def test_a_profile_pinned_to_0_11_provisions_and_serves_p_d(lab: LabHandle, tmp_path: Path) -> None:
    """lab-same-host pins vLLM 0.11.0 (the default pin is 0.33.0, lab-cross above): its units render the
    simulator as 0.11, converge in two runs, and a prefill → decode request over the side channel works
    the way 0.11 pairs them (one X-Request-Id on both legs, no remote_request_id, no vllm:nixl_*). Then
    the same fleet pinned to 0.11.2 provisions with 0.11.2's own rules, not its minor's (issue 25 item 1:
    chunked prefill off and cpu KV buffers, which 0.11.0 refuses, and NIXL's metrics). The session runs it
    right after Molecule's `test --all`, on the lab-same-host fleet that leaves: its first run then changes
    nothing, which is the second run's proof, so no second run; alone, it converges whatever the lab runs,
    then a second run changes nothing."""
    inventory = REPO_ROOT / "inventory" / "lab-same-host.yml"
    first = _provision("lab-same-host", inventory, tmp_path / "first.json")
    if first["totals"]["changed"]:  # alone; in the session Molecule left it converged: this was the second
        second = _provision("lab-same-host", inventory, tmp_path / "second.json")
        assert second["totals"]["changed"] == 0, {h: v["changes"] for h, v in second["hosts"].items()}
    prof = load_profile("lab-same-host", REPO_ROOT / "profiles")
    assert prof.vllm.version == "0.11.0"
    topology = build_topology(prof, load_inventory(inventory))
    p1 = next(h for h in lab.hosts if h.name == "lab-p1")
    by_pool = {i.pool: i for i in topology.on_host("lab-p1")}
    prefill, decode = by_pool["prefill"], by_pool["decode"]
    rc, out, err = lab.ssh(p1, f"systemctl cat {prefill.unit}")
    assert rc == 0 and "--sim-vllm-version 0.11.0" in out, err
    model = prof.model.served_model_name or prof.model.id
    ask = {
        "model": model,
        "prompt": "x" * 400,
        "max_tokens": 1,
        "kv_transfer_params": {"do_remote_decode": True},
    }
    curl = "curl -fsS -H 'Content-Type: application/json' -H 'X-Request-Id: lab-011' --data-binary @-"
    p_url, d_url = (f"http://{i.address}:{i.port}" for i in (prefill, decode))
    rc, out, err = lab.ssh(p1, f"echo '{json.dumps(ask)}' | {curl} {p_url}/v1/completions")
    assert rc == 0, err
    params = json.loads(out)["kv_transfer_params"]
    assert "remote_request_id" not in params and isinstance(params["remote_block_ids"][0], int)
    follow = {"model": model, "prompt": "x" * 400, "max_tokens": 3, "kv_transfer_params": params}
    rc, out, err = lab.ssh(p1, f"echo '{json.dumps(follow)}' | {curl} {d_url}/v1/completions")
    assert rc == 0 and json.loads(out)["usage"]["completion_tokens"] == 3, err
    rc, out, _ = lab.ssh(p1, f"curl -fsS {d_url}/metrics")
    assert rc == 0 and "vllm:nixl_" not in out and "vllm:request_success_total" in out
    # the 0.11 producer freed the blocks on the consumer's notification (no 120 s wait)
    rc, out, _ = lab.ssh(p1, f"curl -fsS {p_url}/metrics")
    assert rc == 0 and any(
        line.startswith("vllm:kv_cache_usage_perc{") and line.endswith(" 0.0") for line in out.splitlines()
    )
    _provisions_a_0_11_2_pin(lab, inventory, tmp_path, ask, follow)


def _provisions_a_0_11_2_pin(
    lab: LabHandle, inventory: Path, tmp_path: Path, ask: dict[str, object], follow: dict[str, object]
) -> None:
    """lab-same-host pinned to 0.11.2 with what 0.11.2 honours and 0.11.0 refuses (the decode pool's
    chunked prefill off, cpu KV buffers): one provision takes it, the units run the simulator as 0.11.2
    with those flags, and the decode instance exports the six vllm:nixl_* families 0.11.2 registers,
    counting the one transfer."""
    profiles = tmp_path / "profiles"
    shutil.copytree(REPO_ROOT / "profiles", profiles)
    pinned = profiles / "lab-same-host-0112.yml"
    pinned.write_text(
        "extends: lab-same-host\n"
        'vllm: {version: "0.11.2"}\n'
        "kv_transfer: {buffer_device: cpu}\n"
        "pools: {decode: {enable_chunked_prefill: false, max_num_batched_tokens: 32768}}\n"
    )
    _provision(str(pinned), inventory, tmp_path / "0112.json")
    p1 = next(h for h in lab.hosts if h.name == "lab-p1")
    prof = load_profile(str(pinned), profiles)
    by_pool = {i.pool: i for i in build_topology(prof, load_inventory(inventory)).on_host("lab-p1")}
    prefill, decode = by_pool["prefill"], by_pool["decode"]
    rc, out, err = lab.ssh(p1, f"systemctl cat {decode.unit}")
    assert rc == 0 and "--sim-vllm-version 0.11.2" in out and "--no-enable-chunked-prefill" in out, err
    assert '"kv_buffer_device":"cpu"' in out, out
    curl = "curl -fsS -H 'Content-Type: application/json' -H 'X-Request-Id: lab-0112' --data-binary @-"
    p_url, d_url = (f"http://{i.address}:{i.port}" for i in (prefill, decode))
    rc, out, err = lab.ssh(p1, f"echo '{json.dumps(ask)}' | {curl} {p_url}/v1/completions")
    assert rc == 0, err
    params = json.loads(out)["kv_transfer_params"]
    assert "remote_request_id" not in params  # 0.11.2 pairs by X-Request-Id, as 0.11.0
    rc, out, err = lab.ssh(
        p1, f"echo '{json.dumps({**follow, 'kv_transfer_params': params})}' | {curl} {d_url}/v1/completions"
    )
    assert rc == 0 and json.loads(out)["usage"]["completion_tokens"] == 3, err
    rc, out, _ = lab.ssh(p1, f"curl -fsS {d_url}/metrics")
    assert rc == 0
    families = {  # a counter's TYPE line names it with its _total
        line.split()[2].removesuffix("_total")
        for line in out.splitlines()
        if line.startswith("# TYPE vllm:nixl_")
    }
    assert families == {n for n in RELEASES["0.11.2"].metric_names() if n.startswith("vllm:nixl_")}, families
    assert len(families) == 6
    assert any(
        line.startswith("vllm:nixl_xfer_time_seconds_count{") and line.endswith(" 1.0")
        for line in out.splitlines()
    ), out

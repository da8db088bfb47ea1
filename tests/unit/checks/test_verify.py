"""`invoke verify`: unit lists, parsers, and real runs over SSH (ops.ssh's connection, testinfra on it)
against a loopback sshd: checks pass, skip or fail naming host and check; an unknown or changed host key
and a host that does not answer are reported with the reason."""

from __future__ import annotations

import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pdfleet.bench.procs import free_port
from pdfleet.checks.verify import (
    FAIL,
    PASS,
    SKIP,
    CheckResult,
    VerifyOptions,
    VerifyPlugin,
    _host_and_check,
    env_pairs,
    host_units,
    parse_ib_write_bw,
    pd_pairs,
    run_verify,
    secret_values,
    table_rows,
)
from pdfleet.fleet.roles import ManagedUnit
from pdfleet.fleet.topology import build_topology
from pdfleet.hw.kv import render_env
from pdfleet.model.inventory import Host, Inventory, load_inventory
from pdfleet.model.profile import Profile
from pdfleet.model.profile_loader import load_profile
from tests.unit.fleet.helpers import two_pd_deployment
from tests.unit.helpers import Sshd, SystemdUnits
from tests.unit.hw.helpers import REPO, host, pinned, profile


def _units(prof: Profile, h: Host) -> list:  # type: ignore[type-arg]
    """host_units of a host alone in its fleet."""
    inventory = Inventory(Path("<one host>"), {h.name: h}, {g: (h.name,) for g in h.groups})
    return host_units(build_topology(prof, inventory), h)


def test_host_units_per_pool() -> None:
    prof = pinned()
    [prefill] = _units(prof, host(groups=("prefill",)))
    assert prefill.unit == "vllm-prefill.service"
    assert prefill.port == prof.pools.get("prefill").port
    assert _units(prof, host(groups=("gateway",))) == []
    colo = _units(profile("colocated"), host(groups=("colocated",)))
    assert [u.unit for u in colo] == ["vllm-colocated.service"] and colo[0].health_url.endswith("/health")


def test_pd_pairs_skip_same_host() -> None:
    p, d, both = host("p", ("prefill",)), host("d", ("decode",)), host("b", ("prefill", "decode"))
    assert [(a.name, b.name) for a, b in pd_pairs([p, d, both])] == [("p", "d"), ("p", "b"), ("b", "d")]


def test_parse_ib_write_bw_report() -> None:
    # perftest's --report_gbits result block (perftest README / ib_write_bw output)
    text = (
        "---------------------------------------------------------------------------------------\n"
        " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
        " 65536      1832760          0.00               384.39             0.733173\n"
        "---------------------------------------------------------------------------------------\n"
    )
    assert parse_ib_write_bw(text) == 384.39
    assert parse_ib_write_bw("Couldn't connect to 10.0.0.1:18515\n") is None


def test_secret_values_only_key_like_variables() -> None:
    env = "UCX_TLS=all\nPDFLEET_GATEWAY_KEY=sk-abcdefgh12345\n# API_KEY=commented-out-value\nTOKEN=short\n"
    assert secret_values(env) == ["sk-abcdefgh12345"]


def test_env_pairs_read_what_render_env_writes() -> None:
    text = render_env({"UCX_TLS": "rc,ud,sm,^cuda_ipc", "UCX_IB_GID_INDEX": "3"})
    assert env_pairs(text) == [("UCX_TLS", "rc,ud,sm,^cuda_ipc"), ("UCX_IB_GID_INDEX", "3")]


def test_nodeid_to_host_and_check() -> None:
    assert _host_and_check("tests/hosts/test_gpu.py::test_persistence_on[lab-p1]") == (
        "lab-p1",
        "gpu/persistence_on",
    )
    assert _host_and_check("test_bandwidth.py::test_ib_write_bw[p->d]") == ("p->d", "bandwidth/ib_write_bw")


def test_table_rows_keep_run_order() -> None:
    rs = [CheckResult("a", "x", PASS), CheckResult("b", "x", FAIL, "why"), CheckResult("a", "y", SKIP, "n/a")]
    checks, hosts, cells = table_rows(rs)
    assert checks == ["x", "y"] and hosts == ["a", "b"] and cells[("x", "b")].detail == "why"


def _loopback_inventory(tmp_path: Path, sshd, colocated: bool = False) -> Path:  # type: ignore[no-untyped-def]
    inv = tmp_path / "inv.yml"
    host = (
        f"          ansible_host: 127.0.0.1\n          ansible_port: {sshd.port}\n"
        f"          ansible_user: root\n          ansible_ssh_private_key_file: {sshd.key_file}\n"
        f"          pdfleet_known_hosts_file: {sshd.known_hosts}\n"
    )
    inv.write_text(
        "all:\n  children:\n    prefill:\n      hosts:\n        loop:\n" + host + "          gpus: [0, 1]\n"
        "    decode:\n      hosts:\n        loop: {}\n"
        # the profile's colocated baseline pool needs a host of its own (the same sshd) to pass the checks
        + (
            "    colocated:\n      hosts:\n        colo:\n" + host + "          gpus: [0]\n"
            if colocated
            else ""
        )
    )
    return inv


def _topology(prof: Profile, inv: Inventory):  # type: ignore[no-untyped-def]
    return build_topology(prof, inv)


@pytest.mark.sshd
def test_verify_over_ssh_skips_hardware_and_fails_naming_host_and_check(tmp_path: Path, sshd) -> None:  # type: ignore[no-untyped-def]
    inv = load_inventory(_loopback_inventory(tmp_path, sshd))
    prof = profile("same-host-pcie")
    junit = tmp_path / "verify.xml"
    run = run_verify(
        prof, _topology(prof, inv), list(inv.hosts.values()), VerifyOptions(junit=junit, connect_timeout=5)
    )
    by_check = {r.check: r for r in run.results}
    # this machine has no NVIDIA GPU and the profile moves KV over PCIe: skipped with the reason
    assert by_check["gpu/driver_version_matches_pin"].outcome == SKIP
    assert by_check["gpu/driver_version_matches_pin"].detail == "no NVIDIA GPU on the PCI bus"
    assert by_check["rdma/mtu"].detail == "topology same-host: KV does not cross hosts"
    # this machine runs Debian 12: the OS fact provision reads, read over SSH the same way
    assert by_check["platform/supported"].outcome == PASS
    assert by_check["platform/driver_branch_and_repository"].detail == "no NVIDIA GPU on the PCI bus"
    # no vLLM units or NIXL venv here: failures name the host and the check
    units = by_check["services/units_installed_enabled_active"]
    assert units.outcome == FAIL and units.host == "loop" and "vllm-prefill.service" in units.detail
    assert (
        by_check["kv/kv_library_importable"].outcome == FAIL
        and "import nixl" in by_check["kv/kv_library_importable"].detail
    )
    assert run.exit_code != 0
    cases = ET.parse(junit).getroot().iter("testcase")
    assert any(c.get("name") == "test_units_installed_enabled_active[loop]" for c in cases)


@pytest.mark.sshd
def test_a_host_of_a_second_p_d_model_is_checked_for_its_own_transfer_library(tmp_path: Path, sshd) -> None:  # type: ignore[no-untyped-def]
    """A models: profile whose first model is colocated (NIXL at its top level) and whose second runs P/D on
    `loop` over Mooncake: loop's library check imports mooncake, as the kv_transfer role installs it."""
    inv = load_inventory(_loopback_inventory(tmp_path, sshd, colocated=True))
    path = tmp_path / "two.yml"
    path.write_text(
        "extends: same-host-pcie\ngateway: {model_alias: null}\nmodels:\n"
        "  - {name: chat, aliases: [chat], topology: colocated,\n"
        "     pools: {prefill: null, decode: null, colocated: {hosts: [colo]}}}\n"
        "  - {name: big, aliases: [big], pools: {colocated: null},\n"
        "     kv_transfer: {connector: MooncakeConnector, mooncake_protocol: tcp}}\n"
    )
    prof = load_profile(str(path), REPO / "profiles")
    options = VerifyOptions(checks="kv_library", connect_timeout=5)
    run = run_verify(prof, _topology(prof, inv), [inv.hosts["loop"]], options)
    [result] = run.results
    assert result.outcome == FAIL and "import mooncake" in result.detail, result.detail


@pytest.mark.sshd
def test_verify_passes_when_only_skipping_checks_run(tmp_path: Path, sshd) -> None:  # type: ignore[no-untyped-def]
    inv = load_inventory(_loopback_inventory(tmp_path, sshd))
    prof = profile("same-host-pcie")
    checks = VerifyOptions(checks="gpu or rdma")
    run = run_verify(prof, _topology(prof, inv), list(inv.hosts.values()), checks)
    assert (
        run.results and {r.outcome for r in run.results} == {SKIP} and not run.failed and run.exit_code == 0
    )


def _only_result(inv_file: Path) -> CheckResult:
    """The one result of a kv_env run over the inventory."""
    inv = load_inventory(inv_file)
    prof = profile("same-host-pcie")
    options = VerifyOptions(checks="kv_env", connect_timeout=3)
    run = run_verify(prof, _topology(prof, inv), list(inv.hosts.values()), options)
    [result] = run.results
    assert result.outcome == FAIL and result.host == "loop" and run.exit_code != 0
    return result


@pytest.mark.sshd
def test_verify_refuses_an_unknown_host_key(tmp_path: Path, sshd) -> None:  # type: ignore[no-untyped-def]
    inv_file = _loopback_inventory(tmp_path, sshd)
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    inv_file.write_text(inv_file.read_text().replace(str(sshd.known_hosts), str(empty)))
    detail = _only_result(inv_file).detail
    assert detail.startswith(f"cannot reach loop (127.0.0.1:{sshd.port}) over SSH: ")
    assert f"host key for loop (127.0.0.1:{sshd.port}) is not in {empty}" in detail  # ops.ssh's words
    assert "ssh-keyscan" in detail and empty.read_text() == ""  # the fix named, nothing trusted


@pytest.mark.sshd
def test_verify_refuses_a_changed_host_key(tmp_path: Path, sshd) -> None:  # type: ignore[no-untyped-def]
    other = tmp_path / "other_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    keytype, blob = other.with_suffix(".pub").read_text().split()[:2]
    wrong = tmp_path / "wrong_known_hosts"
    wrong.write_text(f"[127.0.0.1]:{sshd.port} {keytype} {blob}\n")
    inv_file = _loopback_inventory(tmp_path, sshd)
    inv_file.write_text(inv_file.read_text().replace(str(sshd.known_hosts), str(wrong)))
    detail = _only_result(inv_file).detail
    assert f"host key for loop (127.0.0.1:{sshd.port}) has CHANGED" in detail


def test_verify_names_a_host_that_does_not_answer(tmp_path: Path) -> None:
    closed = free_port()
    inv_file = tmp_path / "inventory.yml"
    inv_file.write_text(
        "all:\n  children:\n    prefill:\n      hosts:\n        loop:\n"
        f"          ansible_host: 127.0.0.1\n          ansible_port: {closed}\n"
        f"          pdfleet_known_hosts_file: {tmp_path / 'known_hosts'}\n"
        "    decode:\n      hosts:\n        loop: {}\n"
    )
    detail = _only_result(inv_file).detail
    assert detail.startswith(f"cannot reach loop (127.0.0.1:{closed}) over SSH: cannot connect to loop")


@pytest.mark.sshd
def test_invoke_verify_cli_table_and_exit_codes(tmp_path: Path, sshd) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    inv = _loopback_inventory(tmp_path, sshd, colocated=True)
    base = [sys.executable, "-m", "invoke", "verify", "--profile", "same-host-pcie", "--inventory", str(inv)]
    ok = subprocess.run([*base, "--checks", "gpu"], cwd=REPO, capture_output=True, text=True, timeout=300)
    text = " ".join(ok.stdout.split())
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "skip loop gpu/persistence_on: no NVIDIA GPU on the PCI bus" in text and "0 failed" in text
    bad = subprocess.run(
        [*base, "--checks", "services"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    text = " ".join(bad.stdout.split())
    assert bad.returncode == 1
    assert "FAIL loop services/units_installed_enabled_active: vllm-prefill.service not installed" in text
    limit = subprocess.run(
        [*base, "--limit", "nosuch"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert limit.returncode != 0 and "nosuch" in limit.stderr and "Traceback" not in limit.stderr


@pytest.mark.sshd
@pytest.mark.systemd
def test_verify_reads_unit_health_over_ssh_from_a_real_systemd(
    tmp_path: Path, systemd_sshd: Sshd, systemd_units: SystemdUnits
) -> None:
    inv = load_inventory(_loopback_inventory(tmp_path, systemd_sshd))
    prof = profile("same-host-pcie")
    down_url = f"http://127.0.0.1:{systemd_units.closed_port}/health"
    web = ManagedUnit("www.service", systemd_units.port, systemd_units.health_url)  # web.service's alias
    down = ManagedUnit("down.service", systemd_units.closed_port, down_url)
    options = VerifyOptions(checks="units_installed or health_answers", connect_timeout=5)

    def verify_units(*units: ManagedUnit) -> dict[str, CheckResult]:
        run = run_verify(prof, _topology(prof, inv), list(inv.hosts.values()), options, lambda _: list(units))
        return {r.check: r for r in run.results}

    healthy = verify_units(web)
    assert {r.outcome for r in healthy.values()} == {PASS} and len(healthy) == 2, healthy
    broken = verify_units(web, down)
    units, health = broken["services/units_installed_enabled_active"], broken["services/health_answers"]
    assert units.outcome == FAIL and units.detail == "down.service static/failed", units
    assert health.outcome == FAIL and health.detail == f"/health does not answer: {down_url} (unreachable)", (
        health
    )


def test_the_kv_checks_read_each_host_s_own_p_d_model(tmp_path: Path) -> None:
    """Two P/D models on two connectors: the checks of lab-p2 read moon-8b's (Mooncake), lab-p1's
    nixl-8b's (the first model's connector read for both checked NIXL on the Mooncake hosts)."""
    d = two_pd_deployment(tmp_path)
    hosts = d.inventory.hosts
    plugin = VerifyPlugin(d.profile, d.topology, [hosts["lab-p1"], hosts["lab-p2"]], VerifyOptions())
    assert plugin.kv_profile(hosts["lab-p2"]).kv_transfer.connector == "MooncakeConnector"
    assert plugin.kv_profile(hosts["lab-p1"]).kv_transfer.connector == "NixlConnector"

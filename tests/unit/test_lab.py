"""The lab's pieces that need no root: keys, config files, mirrors' indexes and wheels, validation."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import paramiko
import pytest
from invoke import Config, Context
from invoke.exceptions import Exit

import pdfleet.cli.lab as cli_lab
from pdfleet.errors import ValidationError
from pdfleet.fleet.host_wheel import _record_hash, retag_wheel
from pdfleet.lab import system
from pdfleet.lab.control import Lab, find_host
from pdfleet.lab.hosts import LabHost, hosts_file, network_file
from pdfleet.lab.image import ImageRecipe, host_debian_mirror
from pdfleet.lab.mirrors import (
    pypi_requirements,
    role_apt_packages,
    write_simple_index,
)
from pdfleet.lab.paths import LabPaths
from pdfleet.lab.sshkeys import ensure_client_key, known_hosts_lines, read_host_public_keys, write_host_keys
from pdfleet.lab.system import LabError, ProcessRef, preflight
from pdfleet.model.inventory import load_inventory
from pdfleet.model.inventory_checks import check_against_inventory
from pdfleet.model.profile_loader import load_profile

REPO = Path(__file__).resolve().parents[2]
LAB_YML = REPO / "inventory" / "lab.yml"


def _inventory(tmp_path: Path, hosts: str) -> Path:
    path = tmp_path / "inv.yml"
    path.write_text("all:\n  hosts:\n" + hosts)
    return path


def test_lab_inventory_has_the_agreed_hosts_and_connection_vars() -> None:
    inv = load_inventory(LAB_YML)
    assert {h.name: (h.address, sorted(h.groups)) for h in inv.hosts.values()} == {
        "lab-gw": ("198.18.0.10", ["gateway", "monitoring"]),
        "lab-colo1": ("198.18.0.11", ["colocated"]),
        "lab-p1": ("198.18.0.21", ["prefill"]),
        "lab-d1": ("198.18.0.31", ["decode"]),
    }
    for host in inv.hosts.values():
        assert host.user == "ops"
        assert host.key_file == str(LabPaths().key_file)
        assert host.known_hosts_file == str(LabPaths().known_hosts)
    hosts = Lab(LabPaths(), REPO, LAB_YML).hosts()
    assert [h.name for h in hosts] == ["lab-gw", "lab-colo1", "lab-p1", "lab-d1"]


def test_same_host_inventory_uses_the_lab_hosts_as_lab_yml_declares_them() -> None:
    lab = {h.name: h for h in load_inventory(LAB_YML).hosts.values()}
    same = load_inventory(REPO / "inventory" / "lab-same-host.yml")
    for host in same.hosts.values():
        assert host.name in lab
        assert (host.address, host.user, host.key_file) == (lab[host.name].address, lab[host.name].user,
                                                             lab[host.name].key_file)
    assert same.hosts["lab-p1"].in_group("prefill") and same.hosts["lab-p1"].in_group("decode")


@pytest.mark.parametrize(("profile", "base", "inventory"), [
    ("lab-colocated", "colocated", "lab.yml"),
    ("lab-cross", "cross-rdma", "lab.yml"),
    ("lab-same-host", "same-host-pcie", "lab-same-host.yml"),
])
def test_lab_profiles_extend_the_real_ones_with_sim_and_mirrors(
        profile: str, base: str, inventory: str) -> None:
    lab = load_profile(profile, REPO / "profiles")
    real = load_profile(base, REPO / "profiles")
    assert lab.extends == base
    assert lab.vllm.engine == "sim"
    assert lab.mirrors.apt == "http://198.18.0.1:8081/" and lab.mirrors.apt_trusted
    assert lab.mirrors.pypi == "http://198.18.0.1:8082/simple/"
    assert lab.mirrors.pypi_trusted_host == "198.18.0.1"
    assert lab.topology == real.topology
    assert (lab.pools.prefill, lab.pools.decode) == (real.pools.prefill, real.pools.decode)
    # lab-cross adds the colocated baseline beside its P/D pair (what the gateway routes between)
    assert (lab.pools.colocated is not None) == (profile in ("lab-colocated", "lab-cross"))
    assert lab.kv_transfer == real.kv_transfer
    assert lab.vllm.sim == real.vllm.sim
    check_against_inventory(lab, load_inventory(REPO / "inventory" / inventory))


@pytest.mark.parametrize(("hosts", "message"), [
    ("    a:\n      ansible_host: 10.0.0.5\n", "must be a host address in 198.18.0.0/24"),
    ("    a:\n      ansible_host: 198.18.0.1\n", "other than the bridge's"),
    ("    a:\n      ansible_host: lab-a\n", "is not an IPv4 address"),
    ("    a:\n      ansible_host: 198.18.0.5\n    b:\n      ansible_host: 198.18.0.5\n", "also a's"),
    ("    a-very-long-name:\n      ansible_host: 198.18.0.5\n", "at most 12 characters"),
])
def test_lab_refuses_hosts_off_the_lab_network(tmp_path: Path, hosts: str, message: str) -> None:
    lab = Lab(LabPaths(tmp_path), REPO, _inventory(tmp_path, hosts))
    with pytest.raises(ValidationError, match=message):
        lab.hosts()


def test_find_host_names_the_known_hosts() -> None:
    lab = Lab(LabPaths(), REPO, LAB_YML)
    assert find_host(lab, "lab-p1").address == "198.18.0.21"
    with pytest.raises(ValidationError, match="lab hosts: lab-gw, lab-colo1, lab-p1, lab-d1"):
        find_host(lab, "lab-x")


def test_preflight_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(system.sys, "platform", "darwin")
    with pytest.raises(LabError, match="needs Linux"):
        preflight()
    monkeypatch.setattr(system.sys, "platform", "linux")
    monkeypatch.setattr(system.os, "geteuid", lambda: 1000)
    with pytest.raises(LabError, match="needs root"):
        preflight()
    monkeypatch.setattr(system.os, "geteuid", lambda: 0)
    monkeypatch.setattr(system.shutil, "which", lambda tool: None if tool == "debootstrap" else "/bin/x")
    with pytest.raises(LabError, match="apt-get install -y debootstrap"):
        preflight()


def test_network_file_is_static_with_no_gateway() -> None:
    text = network_file("198.18.0.21")
    assert "Name=host0" in text and "Address=198.18.0.21/24" in text
    assert "Gateway" not in text.replace("no gateway", "") and "DHCP=no" in text


def test_hosts_file_names_every_lab_host() -> None:
    text = hosts_file([LabHost("lab-gw", "198.18.0.10"), LabHost("lab-p1", "198.18.0.21")])
    assert "198.18.0.10\tlab-gw\n" in text and "198.18.0.21\tlab-p1\n" in text


def test_image_key_changes_with_the_package_list_only() -> None:
    a = ImageRecipe("bookworm", "http://deb.debian.org/debian", ("sudo", "curl"))
    assert a.key == ImageRecipe("bookworm", "http://deb.debian.org/debian", ("curl", "sudo")).key
    assert a.key != ImageRecipe("bookworm", "http://deb.debian.org/debian", ("curl", "sudo", "jq")).key


def test_debootstrap_uses_the_machines_debian_mirror(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n\n"
        "Types: deb\nURIs: http://mirror.example/debian/\nSuites: bookworm\n")
    assert host_debian_mirror(tmp_path) == "http://mirror.example/debian"
    assert host_debian_mirror(tmp_path / "none") == "http://deb.debian.org/debian"


def test_known_hosts_from_overlay_keys_are_what_paramiko_checks(tmp_path: Path) -> None:
    etc = tmp_path / "etc-ssh"
    etc.mkdir()
    write_host_keys(etc, "lab-a")
    keys = read_host_public_keys(etc)
    assert [k.split()[0] for k in keys] == ["ssh-ed25519", "ecdsa-sha2-nistp256"]
    assert oct((etc / "ssh_host_ed25519_key").stat().st_mode & 0o777) == "0o600"
    path = tmp_path / "known_hosts"
    path.write_text(known_hosts_lines([(("198.18.0.10", "lab-a"), keys)]))
    parsed = paramiko.HostKeys(str(path))
    private = paramiko.Ed25519Key.from_private_key_file(str(etc / "ssh_host_ed25519_key"))
    for name in ("198.18.0.10", "lab-a"):
        assert parsed.check(name, private)
    other = tmp_path / "other"
    other.mkdir()
    write_host_keys(other, "lab-b")
    assert read_host_public_keys(other) != keys


def test_client_key_is_private_and_stable(tmp_path: Path) -> None:
    key_file = tmp_path / "ssh" / "id_ed25519"
    pub = ensure_client_key(key_file)
    assert pub.startswith("ssh-ed25519 ") and oct(key_file.stat().st_mode & 0o777) == "0o600"
    assert ensure_client_key(key_file) == pub
    assert paramiko.Ed25519Key.from_private_key_file(str(key_file)).get_base64() == pub.split()[1]


def test_roles_apt_packages_include_base() -> None:
    found = role_apt_packages(REPO)
    assert "base" in found and "jq" in found["base"]


def test_pypi_requirements_cover_pdfleet_and_the_router() -> None:
    reqs = pypi_requirements(REPO)
    assert any(r.startswith("vllm-router") for r in reqs)
    assert any(r.startswith("pydantic") for r in reqs)
    assert "pip" in reqs


def _make_wheel(path: Path, version: str = "0.1.0") -> Path:
    wheel = path / f"demo-{version}-py3-none-any.whl"
    info = f"demo-{version}.dist-info"
    files = {
        "demo/__init__.py": b"VALUE = 42\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: demo\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr(f"{info}/RECORD", "".join(f"{n},{_record_hash(d)},{len(d)}\n" for n, d in files.items())
                    + f"{info}/RECORD,,\n")
    return wheel


def test_retagged_wheel_installs_with_the_new_version(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    retagged = retag_wheel(_make_wheel(tmp_path), "0.1.0+gabc123", out)
    assert retagged.name == "demo-0.1.0+gabc123-py3-none-any.whl"
    with zipfile.ZipFile(retagged) as zf:
        names = zf.namelist()
        assert "demo-0.1.0+gabc123.dist-info/METADATA" in names
        assert not any(n.startswith("demo-0.1.0.dist-info/") for n in names)
        assert b"Version: 0.1.0+gabc123" in zf.read("demo-0.1.0+gabc123.dist-info/METADATA")
    target = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet",
                           "--target", str(target), str(retagged)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (target / "demo-0.1.0+gabc123.dist-info").is_dir()
    assert (target / "demo" / "__init__.py").read_text() == "VALUE = 42\n"


def test_simple_index_is_pep503_and_pip_resolves_from_it(tmp_path: Path) -> None:
    root = tmp_path / "pypi"
    (root / "packages").mkdir(parents=True)
    wheel = retag_wheel(_make_wheel(tmp_path), "0.1.0+gdef456", root / "packages")
    write_simple_index(root)
    page = (root / "simple" / "demo" / "index.html").read_text()
    assert f"#sha256={hashlib.sha256(wheel.read_bytes()).hexdigest()}" in page
    assert 'href="demo/"' in (root / "simple" / "index.html").read_text()
    dest = tmp_path / "dl"
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--isolated",
                           "--index-url", (root / "simple").as_uri(), "--dest", str(dest), "demo"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in dest.iterdir()] == [wheel.name]


def test_process_ref_tells_a_live_process_from_a_gone_one() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    ref = ProcessRef.of(proc.pid)
    assert ref is not None and ref.alive()
    assert not ProcessRef(proc.pid, ref.start_time + 1).alive()  # a recycled PID is not ours
    ref.stop(5.0)
    assert not ref.alive()
    proc.wait()


def test_lab_env_prints_exports_or_says_the_gateway_is_not_provisioned(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    lab = Lab(LabPaths(tmp_path), REPO, LAB_YML)
    monkeypatch.setattr(cli_lab, "this_lab", lambda: lab)
    with pytest.raises(Exit) as exc:
        cli_lab.env_task(Context())
    assert exc.value.code != 0
    assert "not provisioned yet" in capsys.readouterr().err
    lab.paths.gateway_client_key.write_text("sk-lab-123\n")
    cli_lab.env_task(Context())
    assert capsys.readouterr().out.splitlines() == [
        "export OPENAI_BASE_URL=http://198.18.0.10:8080/v1",
        "export OPENAI_API_KEY=sk-lab-123",
    ]
    # the port is the provisioned profile's, not a constant
    profiles = tmp_path / "profiles"
    shutil.copytree(REPO / "profiles", profiles)
    (profiles / "lab-alt-port.yml").write_text("extends: lab-cross\ngateway:\n  port: 9080\n")
    ctx = Context(Config(overrides={"pdfleet": {"profiles_dir": str(profiles)}}))
    cli_lab.env_task(ctx, profile="lab-alt-port")
    assert capsys.readouterr().out.splitlines()[0] == "export OPENAI_BASE_URL=http://198.18.0.10:9080/v1"
    with pytest.raises(Exit):
        cli_lab.env_task(ctx, profile="no-such-profile")
    assert "no-such-profile" in capsys.readouterr().err


def test_lab_addresses_are_refused_while_the_bridge_is_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the lab down, packets to 198.18.0.x would follow the default route off this machine."""
    from pdfleet.lab import network

    monkeypatch.setattr(network, "link_exists", lambda name: False)
    problem = network.lab_route_problem(["198.18.0.10", "10.20.0.5", "gw.example"])
    assert problem is not None and "198.18.0.10" in problem and "invoke lab.up" in problem
    assert "10.20.0.5" not in problem
    assert network.lab_route_problem(["10.20.0.5", "gw.example"]) is None
    monkeypatch.setattr(network, "link_exists", lambda name: True)
    assert network.lab_route_problem(["198.18.0.10"]) is None

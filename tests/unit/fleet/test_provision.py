"""What provision installs, rendered offline (render_fleet): golden files per example profile and host,
systemd's own verifier, and the invariants operators rely on (modes, limits, no secrets on command
lines, serve lines the simulator parses, a policy the real gateway loads)."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import roles.gateway as gateway_role
import roles.services as services_role
from pdfleet.fleet.gateway_tls import tls_material
from pdfleet.fleet.host_layout import MODELS_DIR
from pdfleet.fleet.provision import host_facts, render_fleet
from pdfleet.fleet.render import RenderedFile, write_tree
from pdfleet.hw.distro import CUDA_SOURCE
from pdfleet.hw.gpu import GPU_FACTS
from pdfleet.hw.os_facts import OsReleaseFact
from pdfleet.hw.rdma_facts import RdmaSysfsFact
from pdfleet.lab import pki
from pdfleet.lab.model_mirror import lab_model_files
from pdfleet.model.platforms import find_platform
from pdfleet.model.tls import GatewayTls
from pdfleet.ops.apt import AptPackages
from pdfleet.ops.files import FileContent
from pdfleet.ops.systemd import ManagedUnitFiles
from tests.unit.fleet.helpers import EXAMPLES, REPO, TEST_SECRETS, deploy, fleet_of, profile_inventory_pairs
from tests.unit.roles.helpers import deployment

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py

GOLDEN = REPO / "tests" / "golden"


def _render(profile: str) -> dict[str, list[RenderedFile]]:
    deployment = fleet_of(profile)
    return render_fleet(deployment, deployment.inventory.hosts.values())


def _is_pool_unit(path: str) -> bool:
    return path.rsplit("/", 1)[1] in ("vllm-prefill.service", "vllm-decode.service", "vllm-colocated.service")


def _env(text: str) -> dict[str, str]:
    return dict(ln.split("=", 1) for ln in text.splitlines() if "=" in ln and not ln.startswith("#"))


@pytest.mark.parametrize("profile", sorted(EXAMPLES))
def test_render_matches_golden_files(profile: str, tmp_path: Path) -> None:
    """Any change to what provision installs shows up as a reviewed golden-file diff.

    Regenerate after an intended change with: PDFLEET_UPDATE_GOLDEN=1 pytest tests/unit/test_render.py
    """
    rendered = _render(profile)
    golden = GOLDEN / profile
    if os.environ.get("PDFLEET_UPDATE_GOLDEN"):
        shutil.rmtree(golden, ignore_errors=True)
        write_tree(rendered, golden)
    write_tree(rendered, tmp_path)
    got = {p.relative_to(tmp_path): p.read_text() for p in tmp_path.rglob("*") if p.is_file()}
    want = {p.relative_to(golden): p.read_text() for p in golden.rglob("*") if p.is_file()}
    assert sorted(got) == sorted(want)
    for rel, text in got.items():
        assert text == want[rel], f"{rel} differs from tests/golden/{profile}/{rel}"


def test_every_host_of_a_pool_group_gets_its_units() -> None:
    rendered = _render("cross-rdma")
    deployment = fleet_of("cross-rdma")
    for host in deployment.inventory.hosts.values():
        paths = {f.path for f in rendered[host.name]}
        for pool in ("prefill", "decode"):
            assert (f"/etc/systemd/system/vllm-{pool}.service" in paths) == host.in_group(pool)


def _exec_start_argv(unit_text: str) -> list[str]:
    line = next(ln for ln in unit_text.splitlines() if ln.startswith("ExecStart="))
    # systemd's quoting for our output is a subset of POSIX shell's (no escapes inside single quotes)
    return shlex.split(line.removeprefix("ExecStart=").replace("%%", "%").replace("$$", "$"))


@pytest.mark.parametrize("profile", sorted(EXAMPLES))
def test_exec_start_carries_pool_options_and_kv_config(profile: str) -> None:
    import json

    deployment = fleet_of(profile)
    for host, files in _render(profile).items():
        for f in files:
            if not _is_pool_unit(f.path):
                continue
            argv = _exec_start_argv(f.content)
            pool = f.path.rsplit("vllm-", 1)[1].removesuffix(".service")
            spec = getattr(deployment.profile.pools, pool)
            assert argv[argv.index("--port") + 1] == str(spec.port)
            assert argv[argv.index("--max-num-batched-tokens") + 1] == str(spec.max_num_batched_tokens)
            assert argv[argv.index("--gpu-memory-utilization") + 1] == str(spec.gpu_memory_utilization)
            if pool == "colocated":
                assert "--kv-transfer-config" not in argv
            else:
                kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
                assert kv["kv_role"] == {"prefill": "kv_producer", "decode": "kv_consumer"}[pool]
                assert kv["kv_connector"] == deployment.profile.kv_transfer.connector
            assert "--api-key" not in argv, f"{host}: keys never go on command lines"


@pytest.mark.parametrize("profile", sorted(EXAMPLES))
def test_env_files_are_private_and_units_have_the_limits(profile: str) -> None:
    for files in _render(profile).values():
        for f in files:
            if f.path.endswith(".env"):
                assert f.mode == "0600"
            if _is_pool_unit(f.path):
                assert "LimitMEMLOCK=infinity" in f.content
                assert "Restart=on-failure" in f.content
                assert "User=pdfleet" in f.content


def test_same_host_instances_get_distinct_side_channel_ports_and_gpus() -> None:
    rendered = _render("same-host-pcie")
    for files in rendered.values():
        envs = {f.path: _env(f.content) for f in files if f.path.endswith(".env")}
        if len(envs) < 2:
            continue
        ports = {e["VLLM_NIXL_SIDE_CHANNEL_PORT"] for e in envs.values()}
        gpus = [e["CUDA_VISIBLE_DEVICES"] for e in envs.values()]
        assert len(ports) == len(envs)
        assert len(set(gpus)) == len(gpus)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
@pytest.mark.parametrize("profile", sorted(EXAMPLES))
def test_systemd_analyze_verify_accepts_rendered_units(profile: str, tmp_path: Path) -> None:
    """systemd's own verifier finds nothing wrong but the servers' binaries missing on this machine."""
    write_tree(_render(profile), tmp_path)
    units = sorted(tmp_path.rglob("*.service"))
    assert units
    for unit in units:
        proc = subprocess.run(
            ["systemd-analyze", "verify", "--man=no", unit.name],
            cwd=unit.parent,
            capture_output=True,
            text=True,
            check=False,
        )
        problems = [
            ln
            for ln in (proc.stdout + proc.stderr).splitlines()
            if ln.strip() and "is not executable: No such file or directory" not in ln
        ]
        assert not problems, f"{unit}: {problems}"


def test_every_profile_renders_for_some_inventory() -> None:
    from pdfleet.model.profile_loader import list_profiles

    rendered = {name for name, _ in profile_inventory_pairs()}
    assert rendered == set(list_profiles(REPO / "profiles"))


def _staged_here(tmp_path: Path, revision: str) -> Path:
    """The lab model's files at a revision, as a host holds them once staged."""
    directory = tmp_path / revision
    if not directory.exists():
        directory.mkdir()
        for name, data in lab_model_files(revision).items():
            (directory / name).write_bytes(data)
    return directory


@pytest.mark.parametrize(
    ("profile", "inventory"), profile_inventory_pairs(), ids=lambda v: v if isinstance(v, str) else v.name
)
def test_every_rendered_serve_command_parses_under_the_simulator(
    profile: str, inventory: Path, tmp_path: Path
) -> None:
    """A typo in any rendered `vllm serve` line fails here (the sim rejects unknown options as vLLM does);
    a staged model's directory is the lab model's files here (the simulator reads its config.json)."""
    from pdfleet.sim.config import parse_serve_args

    deployment = fleet_of(profile, inventory)
    for host, files in render_fleet(deployment, deployment.inventory.hosts.values()).items():
        by_path = {f.path: f for f in files}
        for f in files:
            if not _is_pool_unit(f.path):
                continue
            env_path = f.path.replace("/etc/systemd/system/", "/etc/pdfleet/").replace(".service", ".env")
            env = _env(by_path[env_path].content)
            argv = _exec_start_argv(f.content)
            assert argv[1] == "serve", f"{host}: {argv[:2]}"
            if argv[2].startswith(f"{MODELS_DIR}/"):  # staged: <MODELS_DIR>/<id>/<revision>
                argv[2] = str(_staged_here(tmp_path, argv[2].rsplit("/", 1)[1]))
            config = parse_serve_args(argv[1:], env=env)
            assert config.port == int(argv[argv.index("--port") + 1])
            if "VLLM_NIXL_SIDE_CHANNEL_PORT" in env:
                assert config.side_channel_port == int(env["VLLM_NIXL_SIDE_CHANNEL_PORT"])


def test_rendered_gateway_policy_and_keys_load_in_the_real_gateway(tmp_path: Path) -> None:
    """The policy provision installs is one pdfleet-gateway accepts, routing to the profile's pools, with
    the site's certificate and key as provision pushes them (lab-cross)."""
    from pdfleet.gateway.policy import load_policy

    lab = REPO / "inventory" / "lab.yml"
    ca = pki.make_ca(tmp_path / "pki")
    pair = pki.issue(ca, tmp_path / "pki", "gateway", ["lab-gw"], ["198.18.0.10"])
    setting = GatewayTls(cert_file=str(pair.cert), key_file=str(pair.key), ca_file=str(ca.cert))
    secrets = dataclasses.replace(TEST_SECRETS, tls=tls_material(setting))
    deployment = deploy("lab-cross", lab, secrets=secrets)
    gateway_host = deployment.inventory.hosts["lab-gw"]
    files = {f.path: f for f in render_fleet(deployment, [gateway_host])["lab-gw"]}
    for name in ("tls.crt", "tls.key"):
        pushed = files[f"/etc/pdfleet/gateway/{name}"]
        (tmp_path / name).write_text(pushed.content)
        (tmp_path / name).chmod(int(pushed.mode, 8))
    key = files["/etc/pdfleet/gateway/tls.key"]
    assert key.secret and key.mode == "0600" and key.owner == "pdfleet"
    assert files["/etc/pdfleet/tls/gateway-ca.crt"].content == ca.cert.read_text()
    keys = tmp_path / "keys.yaml"
    keys.write_text(files["/etc/pdfleet/gateway/keys.yaml"].content)
    keys.chmod(0o600)
    assert files["/etc/pdfleet/gateway/keys.yaml"].mode == "0600"
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        files["/etc/pdfleet/gateway/policy.yaml"]
        .content.replace("/etc/pdfleet/gateway/keys.yaml", str(keys))
        .replace("/etc/pdfleet/gateway/tls.", f"{tmp_path}/tls.")
    )
    active = load_policy(policy)
    assert active.spec.listen.tls is not None and active.tls_expiry is not None
    route = active.routes["llama-3.1-8b"]
    assert route.colocated == ("http://198.18.0.11:8000", "http://198.18.0.12:8000")
    assert route.disagg == "http://127.0.0.1:8090"
    assert active.spec.stage == "colocated"
    assert set(active.keys) == {"1" * 64, "2" * 64}
    router = _exec_start_argv(files["/etc/systemd/system/vllm-router-pd.service"].content)
    assert router[router.index("--prefill") + 1] == "http://198.18.0.21:8100"
    assert router[router.index("--decode") + 1] == "http://198.18.0.31:8200"
    assert router[router.index("--kv-connector") + 1] == "nixl"


def test_the_mooncake_lab_profile_renders_the_router_and_units_for_mooncake() -> None:
    """lab-cross-mooncake: vllm-router in mooncake mode reading the prefill's bootstrap port, the pool
    units on MooncakeConnector for the default pin (which has it), parsed by the simulator."""
    from pdfleet.model.vllm_release_data import RELEASES
    from pdfleet.sim.config import parse_serve_args

    deployment = fleet_of("lab-cross-mooncake", REPO / "inventory" / "lab.yml")
    assert RELEASES[deployment.profile.vllm.version].has_connector("MooncakeConnector")
    hosts = deployment.inventory.hosts
    files = render_fleet(deployment, [hosts["lab-gw"], hosts["lab-p1"], hosts["lab-d1"]])
    gw = {f.path: f.content for f in files["lab-gw"]}
    router = _exec_start_argv(gw["/etc/systemd/system/vllm-router-pd.service"])
    at = router.index("--prefill")
    assert router[at + 1 : at + 3] == ["http://198.18.0.21:8100", "8998"]  # --prefill URL BOOTSTRAP_PORT
    assert router[router.index("--kv-connector") + 1] == "mooncake"
    for host, unit in (("lab-p1", "vllm-prefill"), ("lab-d1", "vllm-decode")):
        content = {f.path: f.content for f in files[host]}[f"/etc/systemd/system/{unit}.service"]
        config = parse_serve_args(_exec_start_argv(content)[1:], env={})
        assert config.kv_transfer is not None and config.kv_transfer.connector == "MooncakeConnector"
        assert config.release.version == deployment.profile.vllm.version


def test_a_hosts_first_batch_is_the_union_of_its_roles_declared_facts() -> None:
    fleet = deployment("lab-cross")
    batch = {
        name: host_facts(fleet, fleet.inventory.hosts[name]) for name in ("lab-gw", "lab-colo1", "lab-p1")
    }
    os_fact = OsReleaseFact()  # provision's own, on every host: what it runs decides whether to go on
    units = ManagedUnitFiles(services_role.UNIT_GLOB)  # services, on every host: old units to retire
    assert batch["lab-gw"] == (
        os_fact,
        AptPackages(),
        units,
        FileContent(gateway_role.POLICY_FILE),
    )  # base, services, gateway, monitoring
    gpu = tuple(f for f in GPU_FACTS if f != os_fact)
    cuda_list = FileContent(
        CUDA_SOURCE
    )  # whether the driver repository is configured (apt-cache policy then)
    assert batch["lab-colo1"] == (
        os_fact,
        AptPackages(),
        *gpu,
        cuda_list,
        units,
    )  # no KV moves there: no RDMA devices
    assert batch["lab-p1"] == (
        os_fact,
        AptPackages(),
        *gpu,
        cuda_list,
        RdmaSysfsFact(),
        units,
    )  # rdma reads them (said in its skip)
    assert len(set(batch["lab-p1"])) == len(batch["lab-p1"])  # each fact once, though several roles read it


@pytest.mark.sshd
def test_provision_check_over_ssh_reads_what_the_host_runs_first(tmp_path: Path, sshd) -> None:  # type: ignore[no-untyped-def]
    """`invoke provision --check` on this machine over loopback SSH: the OS fact is read (this machine runs
    a platform pdfleet provisions, or it is refused in one line), nothing changes, the GPU role plans no
    repository without a GPU (or this platform's own with one)."""
    inv = tmp_path / "inv.yml"
    host = (
        f"          ansible_host: 127.0.0.1\n          ansible_port: {sshd.port}\n"
        f"          ansible_user: root\n          ansible_ssh_private_key_file: {sshd.key_file}\n"
        f"          pdfleet_known_hosts_file: {sshd.known_hosts}\n"
    )
    inv.write_text(
        "all:\n  children:\n    prefill:\n      hosts:\n        loop:\n" + host + "          gpus: [0, 1]\n"
        "    decode:\n      hosts:\n        loop: {}\n"
        "    colocated:\n      hosts:\n        colo:\n" + host + "          gpus: [0]\n"
    )
    report = tmp_path / "report.json"
    argv = ["provision", "--profile", "same-host-pcie", "--inventory", str(inv), "--limit", "loop", "--check"]
    argv += [
        "--roles",
        "base,gpu_driver",
        "--json",
        str(report),
    ]  # no systemd as PID 1 here for the unit roles
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run(
        [sys.executable, "-m", "invoke", *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    release = platform.freedesktop_os_release()
    supported = find_platform(release["ID"], release.get("VERSION_ID", ""), Path("/etc/dgx-release").exists())
    assert report.exists(), run.stdout + run.stderr
    loop = json.loads(report.read_text())["hosts"]["loop"]
    if supported is None:
        assert (
            run.returncode == 1 and loop["error"].startswith("planner: loop: runs ") and loop["changed"] == 0
        )
        return
    assert run.returncode == 0, run.stdout + run.stderr
    assert loop["failed"] == 0 and loop["error"] is None and loop["changed"] > 0  # a plan, nothing applied
    repo = [c["diff"] for c in loop["changes"] if c["op"] == "apt repo cuda"]
    vendors = Path("/sys/bus/pci/devices").glob("*/vendor")
    gpus = any(v.read_text().strip() == "0x10de" for v in vendors)  # NVIDIA's PCI vendor id
    assert bool(repo) == gpus and all(f"/{supported.cuda_repo}/" in d for d in repo if supported.cuda_repo)

"""Operations against fake facts: converged → no changes; drift → exactly the expected commands."""

from __future__ import annotations

import hashlib

import pytest

from pdfleet.ops.base import DAEMON_RELOAD, Change, FakeFacts, Run, Upload
from pdfleet.ops.facts import (
    AptHolds,
    AptPackages,
    CommandRc,
    DirectoryState,
    FileContent,
    FileState,
    GroupEntry,
    GroupInfo,
    LoadedModules,
    PasswdEntry,
    PathInfo,
    PipList,
    SysctlValue,
    SystemdUnitState,
    UnitState,
    UserGroups,
    UserInfo,
)
from pdfleet.ops.operations import (
    APT_INSTALL,
    AptPackage,
    AptRepo,
    AptUpdate,
    CommandOp,
    Directory,
    File,
    Group,
    KernelModule,
    LineInFile,
    OperationError,
    PipRequirements,
    Service,
    Sysctl,
    SystemdUnit,
    Template,
    User,
    edit_lines,
    restart_handler,
)


def sha(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def file_info(content: str, mode: str = "0644", owner: str = "root", group: str = "root") -> PathInfo:
    return PathInfo("file", mode, owner, group, len(content.encode()), sha(content))


def commands(changes: list[Change]) -> list[object]:
    """Run cmds as strings, uploads as (dest, mode, owner, group, content)."""
    out: list[object] = []
    for change in changes:
        for cmd in change.commands:
            if isinstance(cmd, Run):
                out.append(cmd.cmd)
            else:
                assert isinstance(cmd, Upload)
                out.append((cmd.dest, cmd.mode, cmd.owner, cmd.group, cmd.content))
    return out


# --- File / Template -----------------------------------------------------------------------------


def test_file_converged() -> None:
    facts = FakeFacts({FileState("/etc/a.conf"): file_info("x=1\n")})
    assert File("/etc/a.conf", "x=1\n").plan(facts) == []


def test_file_absent_uploads_with_mode_and_shows_content() -> None:
    facts = FakeFacts({FileState("/etc/a.conf"): None})
    changes = File("/etc/a.conf", "x=1\n", mode="0640", owner="root", group="pdfleet").plan(facts)
    assert commands(changes) == [("/etc/a.conf", "0640", "root", "pdfleet", b"x=1\n")]
    assert "create /etc/a.conf" in changes[0].diff and "+x=1" in changes[0].diff


def test_file_content_drift_gives_unified_diff() -> None:
    facts = FakeFacts({FileState("/etc/a.conf"): file_info("x=1\n"), FileContent("/etc/a.conf"): "x=1\n"})
    notify = (restart_handler("vllm-prefill.service"),)
    changes = File("/etc/a.conf", "x=2\n", notify=notify).plan(facts)
    assert commands(changes) == [("/etc/a.conf", "0644", "root", "root", b"x=2\n")]
    assert "-x=1" in changes[0].diff and "+x=2" in changes[0].diff
    assert changes[0].notify == notify


def test_file_mode_only_drift_is_chmod_chown_only() -> None:
    facts = FakeFacts({FileState("/etc/a.env"): file_info("K=v\n", mode="0644", owner="ops", group="ops")})
    changes = File("/etc/a.env", "K=v\n", mode="0600", secret=True).plan(facts)
    assert commands(changes) == ["chmod 0600 /etc/a.env", "chown root:root /etc/a.env"]
    assert changes[0].diff == "mode 0644 → 0600; owner ops:ops → root:root"


def test_file_secret_never_shows_content() -> None:
    facts = FakeFacts({FileState("/etc/keys.yaml"): file_info("key: old-secret\n", mode="0600")})
    changes = File("/etc/keys.yaml", "key: new-secret\n", mode="0600", secret=True).plan(facts)
    assert changes[0].diff == "content changed (secret, not shown)"
    assert "secret" not in changes[0].diff.replace("(secret, not shown)", "")
    created = File("/etc/k2", "key: s3cr3t\n", mode="0600", secret=True).plan(
        FakeFacts({FileState("/etc/k2"): None})
    )
    assert "s3cr3t" not in created[0].diff and "secret" in created[0].diff
    # FileContent was never asked for (FakeFacts would raise KeyError)


def test_file_large_or_binary_old_content_gives_sha_summary() -> None:
    big = PathInfo("file", "0644", "root", "root", 10_000_000, "a" * 64)
    changes = File("/opt/blob", b"\x00\x01").plan(FakeFacts({FileState("/opt/blob"): big}))
    assert changes[0].diff.startswith("content changed (10000000 → 2 bytes, sha256 aaaaaaaaaaaa → ")


def test_file_where_a_directory_is_fails() -> None:
    facts = FakeFacts({FileState("/etc/x"): PathInfo("directory", "0755", "root", "root", 4096)})
    with pytest.raises(OperationError, match="is a directory"):
        File("/etc/x", "a").plan(facts)


def test_file_rejects_relative_path_and_bad_mode() -> None:
    with pytest.raises(OperationError):
        File("etc/x", "a")
    with pytest.raises(OperationError, match="octal"):
        File("/etc/x", "a", mode="rw-r--r--")


def test_template_is_a_file() -> None:
    facts = FakeFacts({FileState("/etc/t"): None})
    changes = Template("/etc/t", "rendered\n").plan(facts)
    assert changes[0].op == "template /etc/t"
    assert commands(changes) == [("/etc/t", "0644", "root", "root", b"rendered\n")]


# --- Directory -----------------------------------------------------------------------------------


def test_directory() -> None:
    d = Directory("/var/lib/pdfleet", mode="0750", owner="pdfleet", group="pdfleet")
    ok = PathInfo("directory", "0750", "pdfleet", "pdfleet", 4096)
    assert d.plan(FakeFacts({DirectoryState("/var/lib/pdfleet"): ok})) == []
    assert commands(d.plan(FakeFacts({DirectoryState("/var/lib/pdfleet"): None}))) == [
        "install -d -m 0750 -o pdfleet -g pdfleet /var/lib/pdfleet"
    ]
    drift = PathInfo("directory", "0755", "root", "root", 4096)
    assert commands(d.plan(FakeFacts({DirectoryState("/var/lib/pdfleet"): drift}))) == [
        "chmod 0750 /var/lib/pdfleet",
        "chown pdfleet:pdfleet /var/lib/pdfleet",
    ]
    with pytest.raises(OperationError):
        d.plan(FakeFacts({DirectoryState("/var/lib/pdfleet"): file_info("")}))


# --- LineInFile ----------------------------------------------------------------------------------


def test_edit_lines_semantics() -> None:
    text = "a=1\n# b\nmemlock=64\n"
    assert edit_lines(text, "a=1", None, True) == text
    assert edit_lines(text, "c=3", None, True) == text + "c=3\n"
    assert edit_lines(text, "memlock=unlimited", r"^memlock=", True) == "a=1\n# b\nmemlock=unlimited\n"
    assert edit_lines("x", "y", None, True) == "x\ny\n"
    assert edit_lines(text, "", r"^#", False) == "a=1\nmemlock=64\n"
    assert edit_lines(text, "zzz", None, False) == text


def test_line_in_file() -> None:
    path = "/etc/security/limits.d/pdfleet.conf"
    content = "* soft memlock 64\n"
    facts = FakeFacts({FileState(path): file_info(content, mode="0640"), FileContent(path): content})
    op = LineInFile(path, "* soft memlock unlimited", regexp=r"^\* soft memlock")
    changes = op.plan(facts)
    assert commands(changes) == [(path, "0640", "root", "root", b"* soft memlock unlimited\n")]
    assert changes[0].op == op.describe() and "+* soft memlock unlimited" in changes[0].diff
    done = "* soft memlock unlimited\n"
    converged = FakeFacts({FileState(path): file_info(done), FileContent(path): done})
    assert op.plan(converged) == []
    created = op.plan(FakeFacts({FileState(path): None}))
    assert commands(created) == [(path, "0644", "root", "root", b"* soft memlock unlimited\n")]


# --- apt -----------------------------------------------------------------------------------------


def test_apt_package_pinned_and_held() -> None:
    op = AptPackage("nvidia-driver", version="550.127.05-1", hold=True)
    converged = FakeFacts(
        {AptPackages(): {"nvidia-driver": "550.127.05-1"}, AptHolds(): frozenset({"nvidia-driver"})}
    )
    assert op.plan(converged) == []
    fresh = FakeFacts({AptPackages(): {}, AptHolds(): frozenset()})
    assert commands(op.plan(fresh)) == [
        f"{APT_INSTALL} nvidia-driver=550.127.05-1",
        "apt-mark hold nvidia-driver",
    ]
    older = FakeFacts({AptPackages(): {"nvidia-driver": "535.0-1"}, AptHolds(): frozenset({"nvidia-driver"})})
    changes = op.plan(older)
    assert commands(changes) == [f"{APT_INSTALL} nvidia-driver=550.127.05-1"]
    assert changes[0].diff == "nvidia-driver 535.0-1 → 550.127.05-1"


def test_apt_package_unpinned_and_glob() -> None:
    assert AptPackage("curl").plan(FakeFacts({AptPackages(): {"curl": "7.88"}})) == []
    assert commands(AptPackage("curl").plan(FakeFacts({AptPackages(): {}}))) == [f"{APT_INSTALL} curl"]
    glob = AptPackage("nvidia-fabricmanager-550", version="550.*")
    assert glob.plan(FakeFacts({AptPackages(): {"nvidia-fabricmanager-550": "550.127.05-1"}})) == []


def test_apt_repo_with_key_and_update() -> None:
    key = "-----BEGIN PGP PUBLIC KEY BLOCK-----\nabc\n-----END PGP PUBLIC KEY BLOCK-----\n"
    repo = AptRepo(
        "cuda",
        "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/",
        "/",
        components=(),
        key=key,
        arch="amd64",
    )
    line = (
        "deb [arch=amd64 signed-by=/etc/apt/keyrings/cuda.asc] "
        "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/ /\n"
    )
    assert repo.source_line() == line
    listfile = "/etc/apt/sources.list.d/cuda.list"
    fresh = FakeFacts({FileState("/etc/apt/keyrings/cuda.asc"): None, FileState(listfile): None})
    assert commands(repo.plan(fresh)) == [
        ("/etc/apt/keyrings/cuda.asc", "0644", "root", "root", key.encode()),
        (listfile, "0644", "root", "root", line.encode()),
        "DEBIAN_FRONTEND=noninteractive apt-get update -q",
    ]
    converged = FakeFacts(
        {FileState("/etc/apt/keyrings/cuda.asc"): file_info(key), FileState(listfile): file_info(line)}
    )
    assert repo.plan(converged) == []


def test_apt_repo_trusted_mirror_and_key_url() -> None:
    mirror = AptRepo("pdfleet-mirror", "http://198.18.0.1:8081/", "bookworm", trusted=True)
    assert mirror.source_line() == "deb [trusted=yes] http://198.18.0.1:8081/ bookworm main\n"
    remote = AptRepo("x", "https://repo.example/", "stable", key_url="https://repo.example/key.gpg")
    changes = remote.plan(
        FakeFacts(
            {FileState("/etc/apt/keyrings/x.gpg"): None, FileState("/etc/apt/sources.list.d/x.list"): None}
        )
    )
    cmds = commands(changes)
    assert "curl -fsSL https://repo.example/key.gpg -o /etc/apt/keyrings/x.gpg.tmp" in str(cmds[0])
    with pytest.raises(OperationError):
        AptRepo("y", "https://r/", "s").plan(FakeFacts())


def test_apt_update_guarded_by_age() -> None:
    op = AptUpdate(max_age_minutes=30)
    fresh_check = "find /var/lib/apt/lists -maxdepth 1 -name '*_Packages*' -mmin -30 2>/dev/null | grep -q ."
    assert op.plan(FakeFacts({CommandRc(fresh_check): 0})) == []
    assert commands(op.plan(FakeFacts({CommandRc(fresh_check): 1}))) == [
        "DEBIAN_FRONTEND=noninteractive apt-get update -q"
    ]


# --- sysctl / kernel module ----------------------------------------------------------------------


def test_sysctl_live_and_persisted() -> None:
    op = Sysctl("net.ipv4.tcp_rmem", "4096 131072 33554432")
    conf = "/etc/sysctl.d/90-pdfleet-net.ipv4.tcp_rmem.conf"
    body = "net.ipv4.tcp_rmem = 4096 131072 33554432\n"
    converged = FakeFacts(
        {SysctlValue("net.ipv4.tcp_rmem"): "4096 131072 33554432", FileState(conf): file_info(body)}
    )
    assert op.plan(converged) == []
    drift = FakeFacts({SysctlValue("net.ipv4.tcp_rmem"): "4096 131072 6291456", FileState(conf): None})
    assert commands(op.plan(drift)) == [
        "sysctl -q -w 'net.ipv4.tcp_rmem=4096 131072 33554432'",
        (conf, "0644", "root", "root", body.encode()),
    ]
    # live value already right, only the persisted file missing
    only_file = FakeFacts({SysctlValue("net.ipv4.tcp_rmem"): "4096 131072 33554432", FileState(conf): None})
    assert commands(op.plan(only_file)) == [(conf, "0644", "root", "root", body.encode())]
    # a key that appears only once a module loads in this run still plans the write
    absent = Sysctl("net.bridge.bridge-nf-call-iptables", 1, persist=False)
    changes = absent.plan(FakeFacts({SysctlValue("net.bridge.bridge-nf-call-iptables"): None}))
    assert commands(changes) == ["sysctl -q -w net.bridge.bridge-nf-call-iptables=1"]


def test_kernel_module_loaded_and_persisted() -> None:
    op = KernelModule("nvidia-peermem")
    persisted = "/etc/modules-load.d/nvidia-peermem.conf"
    converged = FakeFacts(
        {LoadedModules(): frozenset({"nvidia_peermem"}), FileState(persisted): file_info("nvidia-peermem\n")}
    )
    assert op.plan(converged) == []
    fresh = FakeFacts({LoadedModules(): frozenset(), FileState(persisted): None})
    assert commands(op.plan(fresh)) == [
        "modprobe nvidia-peermem",
        (persisted, "0644", "root", "root", b"nvidia-peermem\n"),
    ]


def test_kernel_module_absent_and_blacklisted() -> None:
    op = KernelModule("nouveau", present=False, blacklist=True)
    bl = "/etc/modprobe.d/blacklist-pdfleet-nouveau.conf"
    facts = FakeFacts(
        {
            LoadedModules(): frozenset({"nouveau"}),
            FileState("/etc/modules-load.d/nouveau.conf"): None,
            FileState(bl): None,
        }
    )
    assert commands(op.plan(facts)) == [
        "modprobe -r nouveau",
        (bl, "0644", "root", "root", b"blacklist nouveau\n"),
    ]


# --- systemd -------------------------------------------------------------------------------------

UNIT = "[Unit]\nDescription=x\n[Service]\nExecStart=/bin/true\n"
RUNNING = UnitState("loaded", "active", "running", "enabled")
MISSING = UnitState("not-found", "inactive", "dead", "")


def test_systemd_unit_notifies_reload_and_restart() -> None:
    restart = restart_handler("vllm-decode.service", "http://127.0.0.1:8200/health", timeout=600)
    op = SystemdUnit("vllm-decode.service", UNIT, restart=restart)
    path = "/etc/systemd/system/vllm-decode.service"
    assert op.plan(FakeFacts({FileState(path): file_info(UNIT)})) == []
    changes = op.plan(FakeFacts({FileState(path): None}))
    assert commands(changes) == [(path, "0644", "root", "root", UNIT.encode())]
    assert changes[0].notify == (DAEMON_RELOAD, restart)
    assert restart.unit == "vllm-decode.service"
    assert [c.cmd for c in restart.commands if isinstance(c, Run)][
        0
    ] == "systemctl reset-failed vllm-decode.service 2>/dev/null; systemctl restart vllm-decode.service"
    wait = restart.commands[1]
    assert isinstance(wait, Run) and "curl -fsS" in wait.cmd and "http://127.0.0.1:8200/health" in wait.cmd
    assert wait.on_fail == "journalctl -u vllm-decode.service -n 30 --no-pager"


def test_service_converged_and_start_with_health() -> None:
    op = Service("vllm-prefill.service", health_url="http://127.0.0.1:8100/health", health_timeout=900)
    assert op.plan(FakeFacts({SystemdUnitState("vllm-prefill.service"): RUNNING})) == []
    # unit file written earlier in this same run: facts say not-found; still plan enable + start
    changes = op.plan(FakeFacts({SystemdUnitState("vllm-prefill.service"): MISSING}))
    cmds = commands(changes)
    assert cmds[0] == "systemctl enable vllm-prefill.service"
    assert cmds[1] == (
        "systemctl reset-failed vllm-prefill.service 2>/dev/null; systemctl start vllm-prefill.service"
    )
    assert "curl -fsS" in str(cmds[2]) and "900" in str(cmds[2])
    assert changes[1].starts_unit == "vllm-prefill.service"
    assert all(c.flush == (DAEMON_RELOAD,) for c in changes)
    start = changes[1].commands[0]
    assert isinstance(start, Run) and start.on_fail == "journalctl -u vllm-prefill.service -n 30 --no-pager"


def test_service_stop_disable_and_masked() -> None:
    op = Service("old.service", enabled=False, running=False)
    assert commands(op.plan(FakeFacts({SystemdUnitState("old.service"): RUNNING}))) == [
        "systemctl disable old.service",
        "systemctl stop old.service",
    ]
    masked = UnitState("masked", "inactive", "dead", "masked")
    with pytest.raises(OperationError, match="masked"):
        Service("m.service").plan(FakeFacts({SystemdUnitState("m.service"): masked}))


# --- users and groups ----------------------------------------------------------------------------


def test_group() -> None:
    assert Group("pdfleet").plan(FakeFacts({GroupInfo("pdfleet"): GroupEntry("pdfleet", 998, ())})) == []
    assert commands(Group("pdfleet").plan(FakeFacts({GroupInfo("pdfleet"): None}))) == [
        "groupadd --system pdfleet"
    ]


def test_user_created_with_group_from_same_run() -> None:
    op = User("pdfleet", group="pdfleet", home="/var/lib/pdfleet", groups=("video",))
    facts = FakeFacts({UserInfo("pdfleet"): None, GroupInfo("pdfleet"): None})
    assert commands(op.plan(facts)) == [
        "useradd --system --home-dir /var/lib/pdfleet --no-create-home --shell /usr/sbin/nologin "
        "--gid pdfleet --groups video pdfleet"
    ]
    own_group = User("svc").plan(FakeFacts({UserInfo("svc"): None, GroupInfo("svc"): None}))
    assert "--user-group" in str(commands(own_group)[0])


def test_user_converged_and_drift() -> None:
    op = User("pdfleet", group="pdfleet", home="/var/lib/pdfleet", groups=("video",))
    entry = PasswdEntry("pdfleet", 998, 998, "", "/var/lib/pdfleet", "/usr/sbin/nologin")
    base = {UserInfo("pdfleet"): entry, GroupInfo("pdfleet"): GroupEntry("pdfleet", 998, ())}
    assert op.plan(FakeFacts({**base, UserGroups("pdfleet"): frozenset({"pdfleet", "video"})})) == []
    drift = {**base, UserInfo("pdfleet"): PasswdEntry("pdfleet", 998, 998, "", "/home/p", "/bin/bash")}
    changes = op.plan(FakeFacts({**drift, UserGroups("pdfleet"): frozenset({"pdfleet"})}))
    assert commands(changes) == [
        "usermod --shell /usr/sbin/nologin --home /var/lib/pdfleet --append --groups video pdfleet"
    ]


# --- pip -----------------------------------------------------------------------------------------


def test_pip_requirements_converged_and_upgrade() -> None:
    op = PipRequirements(
        "/opt/pdfleet/venv",
        ("vllm==0.8.5", "nixl>=0.3"),
        index_url="http://198.18.0.1:8082/simple/",
        trusted_host="198.18.0.1",
    )
    assert op.plan(FakeFacts({PipList("/opt/pdfleet/venv"): {"vllm": "0.8.5", "nixl": "0.3.1"}})) == []
    changes = op.plan(FakeFacts({PipList("/opt/pdfleet/venv"): {"vllm": "0.8.4", "nixl": "0.3.1"}}))
    assert commands(changes) == [
        "/opt/pdfleet/venv/bin/python -m pip install --disable-pip-version-check -q "
        "--index-url http://198.18.0.1:8082/simple/ --trusted-host 198.18.0.1 vllm==0.8.5"
    ]
    assert "+ vllm==0.8.5 (have 0.8.4)" in changes[0].diff


def test_pip_requirements_into_missing_venv_creates_it_first() -> None:
    op = PipRequirements("/opt/v", ["vllm-router==0.1.17"])
    changes = op.plan(FakeFacts({PipList("/opt/v"): None}))
    assert commands(changes) == [
        "python3 -m venv /opt/v",
        "/opt/v/bin/python -m pip install --disable-pip-version-check -q vllm-router==0.1.17",
    ]
    # name normalization: vllm_router installed satisfies vllm-router
    assert op.plan(FakeFacts({PipList("/opt/v"): {"vllm-router": "0.1.17"}})) == []


def test_pip_requirements_rejects_bad_requirement() -> None:
    with pytest.raises(OperationError, match="invalid"):
        PipRequirements("/opt/v", ("vllm===",))


# --- command -------------------------------------------------------------------------------------


def test_command_guards() -> None:
    creates = CommandOp("update-initramfs -u", creates="/var/lib/pdfleet/initramfs.done")
    assert creates.plan(FakeFacts({DirectoryState("/var/lib/pdfleet/initramfs.done"): file_info("")})) == []
    assert commands(creates.plan(FakeFacts({DirectoryState("/var/lib/pdfleet/initramfs.done"): None}))) == [
        "update-initramfs -u"
    ]
    unless = CommandOp("nvidia-smi -pm 1", unless="nvidia-smi -q | grep -q 'Persistence Mode *: Enabled'")
    assert unless.plan(FakeFacts({CommandRc(unless.unless or ""): 0})) == []
    assert commands(unless.plan(FakeFacts({CommandRc(unless.unless or ""): 1}))) == ["nvidia-smi -pm 1"]

"""Lab fixtures: the lab is brought up once per session and taken down at the end.

Every test under tests/lab is marked `lab` and skipped, with the reason, where the lab cannot run
(not Linux, not root, a tool missing). Set PDFLEET_LAB_KEEP=1 to leave the lab up after the session.
The tests of STATES run first, the ones that measure latencies, rates and alert timings after them (see
STATES). `./dev test` runs the unit tests beside this one session, at a lower CPU priority.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pdfleet.fleet.roles import apt_packages
from pdfleet.lab.control import Lab, down, up
from pdfleet.lab.paths import LabPaths
from pdfleet.lab.system import REQUIRED_TOOLS
from roles import REGISTRY
from tests.lab.helpers import REPO_ROOT, LabCrossOwed, LabHandle

LAB_DIR = Path(__file__).resolve().parent


# The order of the lab tests: one lab boot and one provision from scratch per session, every later test
# on a provisioned fleet. infra takes the lab down and up; Molecule's destroy takes it down and the test boots
# it again, bare; provision's from-scratch test converges lab-cross on those hosts (asserting every host
# changed, then a second run changing nothing); Molecule's `test --all --destroy never` converges its
# scenarios over that fleet and leaves lab-same-host converged, which provision's 0.11 test checks (a
# second converge there would change nothing); then the rest of provision's file converges lab-cross back,
# and the others run on that fleet. A key is a file or a file::test; a test takes the first key naming it.
FIRST = (
    "test_lab_infra.py",
    "test_lab_molecule.py::test_molecule_destroy_takes_the_lab_down",
    "test_lab_provision.py::test_provision_twice_second_run_changes_nothing",
    "test_lab_molecule.py::test_molecule_test_all_scenarios_pass",
    "test_lab_provision.py::test_a_profile_pinned_to_0_11_provisions_and_serves_p_d",
    "test_lab_provision.py",
)
# After the rest, in this order: the bench, whose load stays in Prometheus's last minutes (doctor's
# healthy-fleet test reads `--minutes 1` and must find no tuning advice), and Molecule's other test, which
# converges lab-cross with a broken template and provisions it back.
LAST = ("test_lab_bench.py", "test_lab_molecule.py")
# The modules that provision a profile of their own: they run back to back (after the other state tests,
# before LAST), each leaving its profile for the next to switch from, and lab-cross is provisioned back once,
# before the next test that shares it (lab_cross_back): one return instead of one per module.
SWITCHING = ("test_lab_mooncake.py", "test_lab_two_models.py", "test_lab_weights.py")
# The tests that provision lab-cross on its colocated stage themselves, whatever the lab runs: they pay the
# lab-cross owed by SWITCHING (lab_cross_back leaves it to them; one converge instead of two). Molecule's
# non-idempotent test runs right after SWITCHING (LAST) and converges lab-cross three times anyway.
PAYS_LAB_CROSS = ("test_lab_molecule.py::test_idempotence_fails_when_a_converge_is_not_idempotent",)
# The tests that check states, files and answers, not latencies, and wait on conditions rather than fixed
# windows (a key as in FIRST). They run first, in the order above; the others measure latencies, rates or
# alert timings (doctor's tuning rules and its healthy fleet view, the KV alert, the rollout's gates, the
# bench) and run after all of them, so that no state test's traffic or provisioning is in their windows.
STATES = (
    "test_lab_infra.py",
    "test_lab_molecule.py",
    "test_lab_provision.py",
    "test_lab_verify.py",
    "test_lab_kv_path.py",  # NIXL's probe between lab-p1 and lab-d1: a pass, then a blocked port named
    "test_lab_gateway.py",
    "test_lab_gateway_anthropic.py",
    "test_lab_mooncake.py",
    "test_lab_demo.py",
    "test_lab_two_models.py",  # provisions lab-two-models and lab-cross back: answers, stages, counters
    "test_lab_weights.py",  # staged files, checksums, verify/doctor findings, refusals; no timing
    "test_lab_shadow.py",  # shadow runs: counts, series present, drop reasons, no client failed; no timing
    "test_lab_keys.py",  # keys added, rotated, revoked: answers per key and no failed request; no timing
    # two hosts moved between pools under traffic and back: layouts, router lists, labels, no failed request
    "test_lab_rebalance.py",
    # doctor's client catalogue and a blocked side channel: findings from answers and host state
    "test_lab_doctor.py::test_healthy_client_view_has_no_error",
    "test_lab_doctor.py::test_healthy_anthropic_view_has_no_error",
    "test_lab_doctor.py::test_a_trailing_space_in_the_key",
    "test_lab_doctor.py::test_a_base_url_at_a_pool_port",
    "test_lab_doctor.py::test_a_chat_body_posted_to_completions",
    "test_lab_doctor.py::test_a_wrong_anthropic_key",
    "test_lab_doctor.py::test_the_side_channel_blocked_on_the_decode_host",
    # monitoring's targets, rule values per pool, reload and `invoke monitor`: series present, not timings
    "test_lab_monitoring.py::test_every_target_is_up",
    "test_lab_monitoring.py::test_each_recording_rule_has_a_value_per_pool_after_streamed_traffic",
    "test_lab_monitoring.py::test_second_provision_changes_nothing_and_a_changed_rule_file_reloads",
    "test_lab_monitoring.py::test_invoke_monitor_shows_the_chain",
    # issue 28: node exporters up and the host rows' data; the pool-down alert through Alertmanager to the
    # lab's recorder (a stopped unit's notification, bounded by the rule's for, not a latency figure)
    "test_lab_monitoring.py::test_node_exporters_are_up_on_every_host_and_the_host_rows_have_data",
    "test_lab_monitoring.py::test_stopping_the_decode_service_fires_pool_down_through_alertmanager_and_resolves",
)


def named(keys: tuple[str, ...], file: str, test: str) -> bool:
    """Whether a key names this test: its file, or file::test (test without its parameters)."""
    return file in keys or f"{file}::{test}" in keys


def run_rank(file: str, test: str) -> tuple[int, int]:
    """Where a lab test runs: the STATES tests, then the others; within each, FIRST in their order, then the
    rest (stable sort: file order), SWITCHING, LAST."""
    group = 0 if named(STATES, file, test) else 1
    for index, key in enumerate(FIRST):
        if named((key,), file, test):
            return group, index
    if file in LAST:
        return group, len(FIRST) + 2 + LAST.index(file)
    return group, len(FIRST) + (1 if file in SWITCHING else 0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test in this directory as a lab test, and order them (see FIRST and STATES)."""
    for item in items:
        if LAB_DIR in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.lab)
    items.sort(key=lambda item: run_rank(Path(str(item.path)).name, getattr(item, "originalname", item.name)))


def lab_unavailable() -> str | None:
    """Why the lab cannot run here, or None."""
    if not sys.platform.startswith("linux"):
        return f"the lab needs Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "the lab needs root (systemd-nspawn, a bridge, overlay mounts)"
    missing = sorted({pkg for tool, pkg in REQUIRED_TOOLS.items() if shutil.which(tool) is None})
    if missing:
        return f"the lab needs: apt-get install -y {' '.join(missing)}"
    return None


@pytest.fixture(scope="session")
def lab_def() -> Lab:
    """The lab of this clone (state under /var/lib/pdfleet-lab, hosts from inventory/lab.yml)."""
    reason = lab_unavailable()
    if reason:
        pytest.skip(reason)
    return Lab(LabPaths(), REPO_ROOT / "inventory" / "lab.yml", apt_packages(REGISTRY))


@pytest.fixture(scope="session")
def lab(lab_def: Lab) -> Iterator[LabHandle]:
    """A running lab for the whole session (built cold if need be), removed at the end."""
    result = up(lab_def, progress=lambda message: print(f"lab: {message}", file=sys.stderr))
    yield LabHandle(lab_def, result.hosts)
    if os.environ.get("PDFLEET_LAB_KEEP") != "1":
        down(lab_def)


def _provision_lab_cross(report: Path) -> None:
    """`invoke provision --profile lab-cross` on its colocated stage (a module may have staged another)."""
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", "provision", "--profile", "lab-cross", "--stage", "colocated"]
        + ["--json", str(report)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.fixture(scope="session")
def lab_cross_for_gateway(lab: LabHandle, tmp_path_factory: pytest.TempPathFactory) -> None:
    """lab-cross provisioned once for the two gateway modules, not once each: they run back to back (STATES)
    and the first leaves lab-cross as it found it (its stage and limited provisions are put back, its
    renewed certificate is the same CA's), so a second provision changed nothing."""
    _provision_lab_cross(tmp_path_factory.mktemp("lab-cross-gateway") / "report.json")


@pytest.fixture(scope="session")
def lab_cross_owed(lab: LabHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabCrossOwed]:
    """Whether a module of SWITCHING left the lab on its own profile; paid at the session's end only when the
    lab stays up (PDFLEET_LAB_KEEP=1, then on lab-cross): a lab going down needs no lab-cross."""
    owed = LabCrossOwed()
    yield owed
    if owed.owed and os.environ.get("PDFLEET_LAB_KEEP") == "1":
        _provision_lab_cross(tmp_path_factory.mktemp("lab-cross-back") / "report.json")


@pytest.fixture(autouse=True)
def lab_cross_back(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> None:
    """lab-cross provisioned back before a test outside SWITCHING when a module of SWITCHING left another
    (not before a test of PAYS_LAB_CROSS, which provisions it and clears `owed` itself).
    A function fixture: the next module's own module-scoped fixtures run before it, so a module after
    SWITCHING must not stage or read the fleet in one (a module fixture that staged the gateway was undone
    by this provision's --stage colocated, seen in a suite run)."""
    file, test = Path(str(request.node.path)).name, getattr(request.node, "originalname", request.node.name)
    if file in SWITCHING or named(PAYS_LAB_CROSS, file, test):
        return
    owed: LabCrossOwed = request.getfixturevalue("lab_cross_owed")
    if owed.owed:
        _provision_lab_cross(tmp_path_factory.mktemp("lab-cross-back") / "report.json")
        owed.owed = False

"""The profile's `monitoring:` section: defaults, validation errors that name the file and key, and
which releases export the NixlConnector's metrics."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdfleet.model.connectors import MOONCAKE, NIXL
from pdfleet.model.monitoring import KVTransferSeries, kv_transfer_series
from pdfleet.model.profile import ProfileError
from pdfleet.model.profile_loader import load_profile
from tests.unit.model.helpers import GOOD, PROFILES, SHIPPED, write


def test_shipped_profiles_get_the_defaults_and_the_lab_its_fast_intervals() -> None:
    for name in SHIPPED:
        mon = load_profile(name, PROFILES).monitoring
        assert (mon.port, mon.scrape_interval_s, mon.retention_days, mon.kv_transfer_p95_ms) == (
            9090,
            15,
            15,
            200,
        )
    lab = load_profile("lab-cross", PROFILES).monitoring
    assert lab.scrape_interval_s <= 5 and lab.alert_for_s <= 60


def _profile(tmp_path: Path, monitoring: str) -> None:
    write(tmp_path, GOOD, "_good.yml")
    write(tmp_path, f"extends: _good\nmonitoring:\n{monitoring}", "p.yml")
    load_profile("p", tmp_path)


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ("  retention_days: 0\n", r"p.yml: monitoring.retention_days: must be >= 1 \(got 0\)"),
        ("  scrape_intervl_s: 5\n", r"p.yml: monitoring.scrape_intervl_s: .*"),
        ("  port: 70000\n", r"p.yml: monitoring.port: must be <= 65535"),
        (
            "  scrape_interval_s: 60\n  rule_window_s: 120\n",
            r"p.yml: monitoring: .*at least 4 × scrape_interval_s",
        ),
        ("  kv_transfer_p95_ms: '200'\n", r"p.yml: monitoring.kv_transfer_p95_ms: "),
    ],
)
def test_bad_values_name_the_file_and_key(tmp_path: Path, section: str, message: str) -> None:
    with pytest.raises(ProfileError, match=message):
        _profile(tmp_path, section)


def test_kv_transfer_series_as_the_pinned_release_registers_them() -> None:
    """NIXL's from 0.11.1 on (D observes), Mooncake's on 0.33 (P observes: it pushes); none on 0.11.0
    or an untabled pin (refused by the profile checks, never assumed)."""
    assert kv_transfer_series(NIXL, "0.11.0") is None and kv_transfer_series(NIXL, "0.10.2") is None
    assert kv_transfer_series(NIXL, "main") is None
    nixl = kv_transfer_series(NIXL, "0.11.2")
    assert nixl == KVTransferSeries(
        NIXL, "vllm:nixl_xfer_time_seconds", ("vllm:nixl_num_failed_transfers",), "decode"
    )
    mooncake = kv_transfer_series(MOONCAKE, "0.33.0")
    assert mooncake is not None and mooncake.histogram == "vllm:mooncake_xfer_time_seconds"
    assert mooncake.role == "prefill" and "vllm:mooncake_num_failed_recvs" in mooncake.failed
    assert kv_transfer_series(MOONCAKE, "0.11.2") is None  # not registered before 0.13

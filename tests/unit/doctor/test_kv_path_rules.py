"""The kv.path rule: each pair's KV-path probe outcome (verify --kv-path) as a doctor finding."""

from __future__ import annotations

from pdfleet.doctor.finding import has_error
from pdfleet.doctor.kv_path_rules import RULE, KvPathResult, rule_kv_path


def test_a_failed_pair_is_an_error_naming_the_stage_and_the_fix() -> None:
    failed = KvPathResult(
        "lab-p1->lab-d1",
        "fail",
        "lab-p1->lab-d1: UCX could not connect to lab-p1's UCX data ports 20100-20199 (no answer)",
        "allow TCP 20100-20199 from lab-d1 to lab-p1 (UCX_TCP_PORT_RANGE)",
    )
    [finding] = rule_kv_path([failed])
    assert (finding.rule, finding.severity, finding.subject) == (RULE, "error", "lab-p1->lab-d1")
    assert "20100-20199" in finding.evidence and "invoke verify --kv-path" in finding.evidence
    assert finding.fix == "allow TCP 20100-20199 from lab-d1 to lab-p1 (UCX_TCP_PORT_RANGE)"
    assert has_error([finding])


def test_a_fail_without_a_fix_points_at_the_probes_own_output() -> None:
    [finding] = rule_kv_path([KvPathResult("a->b", "fail", "collect kv_path: ImportError")])
    assert finding.severity == "error" and "--kv-path --checks kv_path" in finding.fix


def test_passed_and_skipped_pairs_are_ok_findings_saying_what_was_measured_or_why_not() -> None:
    passed = KvPathResult("p->d", "pass", "p->d: 64 MiB in 227 ms = 2.36 Gb/s, setup 29 ms over tcp")
    skipped = KvPathResult("p->d2", "skip", "the KV-path probe speaks NIXL; mooncake is not probed yet")
    found = rule_kv_path([passed, skipped])
    assert [f.severity for f in found] == ["ok", "ok"] and not has_error(found)
    assert "2.36 Gb/s" in found[0].evidence and "not probed" in found[1].what
    assert "mooncake" in found[1].evidence


def test_a_topology_without_a_pd_pair_says_so() -> None:
    [finding] = rule_kv_path([])
    assert finding.severity == "ok" and "no prefill->decode pair" in finding.what

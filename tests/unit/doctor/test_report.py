"""The table and the --json document."""

from __future__ import annotations

import json

from pdfleet.doctor.finding import Finding
from pdfleet.doctor.report import NO_PROBLEMS, format_table, to_json

ERR = Finding(
    "client.base_url", "error", "the base URL is wrong", "GET http://h/models → 404", "set it", subject="u"
)
OK = Finding("client.ok", "ok", "3 probes answered", "…", "")


def test_json_document() -> None:
    doc = json.loads(to_json([OK, ERR], "client", "http://h"))
    assert doc["ok"] is False and doc["counts"] == {"error": 1, "warning": 0, "ok": 1}
    assert doc["findings"][0]["rule"] == "client.base_url"
    assert set(doc["findings"][0]) == {"rule", "severity", "subject", "what", "evidence", "fix", "diff"}


def test_table_says_no_problems_on_a_healthy_setup() -> None:
    text = format_table([OK], "pdfleet doctor")
    assert NO_PROBLEMS in text and "3 probes answered" in text
    bad = format_table([ERR], "pdfleet doctor")
    assert NO_PROBLEMS not in bad and "1 error(s)" in bad and "set it" in bad

"""Combined command outputs split into their `== name` sections."""

from __future__ import annotations

from pdfleet.hw.sections import split_sections


def test_sections_by_name_with_empty_ones_and_nothing_before_the_first_header() -> None:
    out = "stray\n== mtu\n9000\n== addr\n== ecn\na:1\nb:0\n"
    assert split_sections(out) == {"mtu": ["9000"], "addr": [], "ecn": ["a:1", "b:0"]}
    assert split_sections("") == {}

"""Key masking, severity order and profile diffs."""

from __future__ import annotations

from pdfleet.doctor.finding import Finding, has_error, mask_key, mask_text, profile_diff, sorted_findings


def test_mask_key_keeps_prefix_and_last_four_only() -> None:
    assert mask_key("sk-user-0123456789abcdef") == "sk-…cdef"
    assert mask_key("abcdefghijklmnop") == "…mnop"
    assert mask_key("short") == "<5 characters>"
    assert mask_key(" sk-user-0123456789abcdef\n") == "⎵sk-…cdef\\n"


def test_mask_text_masks_raw_and_stripped_forms() -> None:
    key = "sk-user-0123456789abcdef "
    text = f"Bearer {key.strip()} and {key}"
    masked = mask_text(text, [key])
    assert "0123456789" not in masked and masked.count("sk-…cdef") == 2


def test_errors_sort_first_and_decide_the_exit() -> None:
    ok, warn, err = (Finding("r", s, "w", "e", "f") for s in ("ok", "warning", "error"))
    assert [f.severity for f in sorted_findings([ok, warn, err])] == ["error", "warning", "ok"]
    assert has_error([ok, err]) and not has_error([ok, warn])


def test_profile_diff() -> None:
    diff = profile_diff(
        "profiles/p.yml", [("pools.prefill.max_num_batched_tokens", 8192, 16384), ("x", 0.9, True)]
    )
    assert diff.splitlines() == [
        "--- profiles/p.yml",
        "+++ profiles/p.yml",
        "-pools.prefill.max_num_batched_tokens: 8192",
        "+pools.prefill.max_num_batched_tokens: 16384",
        "-x: 0.9",
        "+x: true",
    ]

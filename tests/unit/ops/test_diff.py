"""Human diffs: cut to a readable length, text only when the bytes are small UTF-8."""

from __future__ import annotations

from pdfleet.ops.diff import DIFF_MAX_LINES, as_text, unified


def test_unified_diff_is_cut_at_max_lines() -> None:
    old = "".join(f"{i}\n" for i in range(300))
    new = "".join(f"x{i}\n" for i in range(300))
    lines = unified(old, new, "/etc/big").splitlines()
    assert lines[:2] == ["--- /etc/big (current)", "+++ /etc/big"]
    # 2 file headers, 1 hunk header, 300 removed and 300 added lines: 603, of which DIFF_MAX_LINES shown
    assert len(lines) == DIFF_MAX_LINES + 1
    assert lines[-1] == f"... ({603 - DIFF_MAX_LINES} more diff lines)"


def test_as_text_only_for_small_utf8() -> None:
    assert as_text("ü=1\n".encode(), 10) == "ü=1\n"
    assert as_text(b"\xff\xfe\x00", 10) is None
    assert as_text(b"abc", 2) is None

"""What a doctor rule returns: a `Finding` (what is wrong, the evidence, the fix), and key masking.

Every piece of evidence that may carry an API key goes through `mask_key` / `mask_text` first, so a
finding printed, logged or written as JSON never holds a key.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from pdfleet.model.profile import Profile

Severity = Literal["error", "warning", "ok"]
SEVERITY_ORDER: dict[str, int] = {"error": 0, "warning": 1, "ok": 2}
# A key shorter than this is shown as its length only: its last four characters would be most of it.
MIN_MASKED_LENGTH = 12


@dataclass(frozen=True)
class Finding:
    """One diagnosis: the rule that made it, how bad, what is wrong, the evidence, the fix."""

    rule: str
    severity: Severity
    what: str
    evidence: str
    fix: str
    diff: str | None = None  # the fix as a profile diff, where the fix is a profile change
    subject: str = ""  # what it is about: a URL, a host, a pool

    def to_json(self) -> dict[str, Any]:
        """The finding as JSON (`--json`)."""
        return {
            "rule": self.rule,
            "severity": self.severity,
            "subject": self.subject,
            "what": self.what,
            "evidence": self.evidence,
            "fix": self.fix,
            "diff": self.diff,
        }


def mask_key(key: str) -> str:
    """`sk-…abcd`: the key's prefix up to its first dash (at most 3 characters) and last four characters.

    Whitespace around the key is shown as `⎵`/`\\n` markers so a finding can point at it without the key.
    """
    core = key.strip()
    lead = _ws_marks(key[: len(key) - len(key.lstrip())])
    trail = _ws_marks(key[len(key.rstrip()) :])
    if len(core) < MIN_MASKED_LENGTH:
        shown = f"<{len(core)} characters>"
    else:
        dash = core.find("-")
        prefix = core[: dash + 1] if 0 <= dash < 3 else ""
        shown = f"{prefix}…{core[-4:]}"
    return f"{lead}{shown}{trail}"


def _ws_marks(text: str) -> str:
    """Whitespace made visible: a space as ⎵, a tab as \\t, a newline as \\n."""
    return text.replace(" ", "⎵").replace("\t", "\\t").replace("\r", "\\r").replace("\n", "\\n")


def mask_text(text: str, keys: Iterable[str]) -> str:
    """`text` with every key (and its stripped form) replaced by its masked form."""
    forms = {form for key in keys for form in (key, key.strip()) if form}
    for form in sorted(forms, key=len, reverse=True):
        text = text.replace(form, mask_key(form))
    return text


def sorted_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Errors first, then warnings, then what was checked and found fine; stable within each."""
    return sorted(findings, key=lambda f: SEVERITY_ORDER[f.severity])


def has_error(findings: Iterable[Finding]) -> bool:
    """Whether any finding is an error (the task then exits non-zero)."""
    return any(f.severity == "error" for f in findings)


def profile_diff(source: str, changes: Iterable[tuple[str, Any, Any]]) -> str:
    """A fix as a diff of the profile: `--- source` / `+++ source`, then `- key: old` / `+ key: new`."""
    lines = [f"--- {source}", f"+++ {source}"]
    for key, old, new in changes:
        lines += [f"-{key}: {_yaml_scalar(old)}", f"+{key}: {_yaml_scalar(new)}"]
    return "\n".join(lines)


def profile_fix(profile: Profile, changes: Iterable[tuple[str, Any, Any]]) -> str:
    """`profile_diff` against the file that sets the first key (the profile itself or an `extends:` base),
    named relative to the working directory when it is under it."""
    changes = list(changes)
    path = profile.origin_of(changes[0][0]) if changes else profile.source
    try:
        shown = str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        shown = str(path)
    return profile_diff(shown, changes)


def _yaml_scalar(value: Any) -> str:
    """A scalar as YAML writes it (true/false, numbers, strings bare)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"{value:g}" if isinstance(value, float) else str(value)

"""A semantic problem of a profile (key path and message) and the one error that lists them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pdfleet.model.profile import Profile, ProfileError


@dataclass(frozen=True)
class Problem:
    """One semantic problem: the profile key path it concerns and what is wrong / allowed."""

    path: str
    message: str


def problems_error(profile: Profile, problems: Iterable[Problem]) -> ProfileError:
    """One error listing every problem as `file: key.path: message` (the file that set the key)."""
    return ProfileError([f"{profile.origin_of(p.path)}: {p.path}: {p.message}" for p in problems])

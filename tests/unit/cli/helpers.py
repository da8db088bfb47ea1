"""Shared pieces of the task tests: a Context carrying this repo's invoke.yaml, as `invoke` builds it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from invoke import Config, Context

REPO = Path(__file__).resolve().parents[3]


def project_context(**pdfleet: Any) -> Context:
    """A Context with the repo's invoke.yaml loaded, and `pdfleet:` keys overridden as given."""
    config = Config(project_location=str(REPO), overrides={"pdfleet": pdfleet} if pdfleet else None)
    config.load_project()
    return Context(config)

"""Invoke entry point. Thin by design: the tasks live in pdfleet.cli, the logic in pdfleet."""

from pdfleet.cli import build_namespace

ns = build_namespace()

"""Checks of a provisioned fleet: `invoke verify` (testinfra host checks)."""

"""Roles: one concern each; pdfleet.fleet.roles describes the contract and the order they run in."""

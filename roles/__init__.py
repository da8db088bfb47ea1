"""Roles: one concern each; pdfleet.roles_api describes the contract and the order they run in."""

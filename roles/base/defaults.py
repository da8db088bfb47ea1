"""Defaults of the base role, in one visible place."""

# What every pdfleet host needs: venvs for the servers, curl for health checks, jq for operators.
APT_PACKAGES: tuple[str, ...] = ("python3-venv", "curl", "ca-certificates", "jq", "sudo")
MIRROR_LIST = "/etc/apt/sources.list.d/pdfleet-mirror.list"

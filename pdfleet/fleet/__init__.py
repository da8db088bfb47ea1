"""The fleet as pdfleet deploys it: topology, deployment, roles' contract, rendering, provisioning."""

"""Staged, metric-gated rollout: the pure gate and step decisions, and the `pdfleet-rollout` controller."""

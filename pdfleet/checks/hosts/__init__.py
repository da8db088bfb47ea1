"""Host checks run by `invoke verify` (pdfleet.checks.verify): one module per concern, each check a
pytest function over the VerifyPlugin's `verify`, `pd_host` and `target` fixtures."""

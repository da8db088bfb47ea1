"""Host checks run only through `invoke verify` (pdfleet.verify.VerifyPlugin supplies profile,
inventory, hosts and SSH targets); collected any other way, every check skips saying so."""

from __future__ import annotations

import pytest

from pdfleet.verify import VerifyPlugin


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any(isinstance(p, VerifyPlugin) for p in config.pluginmanager.get_plugins()):
        return
    skip = pytest.mark.skip(reason="host checks run through `invoke verify --profile P`")
    for item in items:
        item.add_marker(skip)

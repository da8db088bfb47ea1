"""vLLM's connector registry per release and did-you-mean suggestions."""

from __future__ import annotations


def test_connector_registry_and_suggestions() -> None:
    from pdfleet.model import connectors

    assert connectors.parse_version("0.11.0") == (0, 11, 0)
    assert connectors.parse_version("0.11.0rc2") == (0, 11, 0)
    assert connectors.parse_version("0.11") is None and connectors.parse_version("latest") is None
    v011 = connectors.registered((0, 11, 0))
    assert v011 is not None and "NixlConnector" in v011 and "MooncakeConnector" not in v011
    assert "OffloadingConnector" in v011 and "OffloadingConnector" not in (
        connectors.registered((0, 10, 2)) or ()
    )
    assert connectors.registered((0, 9, 0)) is None
    assert connectors.suggest("MooncakeTransferEngine") == "MooncakeConnector"
    assert connectors.suggest("nixlconnector") == "NixlConnector"
    assert connectors.suggest("LMCacheConnector") == "LMCacheConnectorV1"
    assert connectors.suggest("Zzzz") is None
    assert connectors.check_connector("NixlConnector", (0, 11, 0)) is None
    assert connectors.check_connector("MooncakeConnector", (0, 15, 0)) is None

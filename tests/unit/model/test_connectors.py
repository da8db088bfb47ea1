"""vLLM connector names against a release's registry (the facts table) and did-you-mean suggestions."""

from __future__ import annotations

from pdfleet.model import connectors
from pdfleet.model.vllm_release_data import RELEASES

OLD, NEW = RELEASES["0.11.0"], RELEASES["0.33.0"]


def test_versions_and_suggestions() -> None:
    assert connectors.parse_version("0.11.0") == (0, 11, 0)
    assert connectors.parse_version("0.11.0rc2") == (0, 11, 0)
    assert connectors.parse_version("0.11") is None and connectors.parse_version("latest") is None
    assert connectors.suggest("MooncakeTransferEngine") == "MooncakeConnector"
    assert connectors.suggest("nixlconnector") == "NixlConnector"
    assert connectors.suggest("LMCacheConnector") == "LMCacheConnectorV1"
    assert connectors.suggest("Zzzz") is None


def test_check_connector_reads_the_release_registry() -> None:
    assert connectors.check_connector("NixlConnector", OLD) is None
    assert connectors.check_connector("NixlConnector", NEW) is None
    assert connectors.check_connector("MooncakeConnector", NEW) is None
    problem = connectors.check_connector("MooncakeConnector", OLD)
    assert (
        problem is not None
        and problem.message.startswith("MooncakeConnector is not registered in vLLM 0.11.0")
        and "use NixlConnector" in problem.message
    )
    wrong = connectors.check_connector("MooncakeTransferEngine", NEW)
    assert wrong is not None and "did you mean MooncakeConnector?" in wrong.message
    other = connectors.check_connector("OffloadingConnector", NEW)
    assert other is not None and "not one pdfleet renders" in other.message

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


def test_every_connector_a_tabled_release_registers_is_known() -> None:
    """Issue 25 (cosmetic): 0.33 registers HiSparseConnector, which the suggestions did not know: pinned to
    0.11.0 it was called "not a vLLM connector". Every name a tabled release registers is known, so a new
    release's connector is added here when it is tabled."""
    registered = {c.name for rel in RELEASES.values() for c in rel.registry.connectors}
    assert registered - connectors.ALL_KNOWN == set()
    problem = connectors.check_connector("HiSparseConnector", OLD)
    assert problem is not None and "not one pdfleet renders" in problem.message, problem
    assert connectors.suggest("hisparseconnector") == "HiSparseConnector"

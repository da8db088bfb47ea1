"""The client gatherer: the key's shape without the key, the probes made in order, a refused port."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from pdfleet.bench.procs import free_port
from pdfleet.doctor.probe import gather_client_facts, key_shape, origin, sdk_trust
from pdfleet.errors import ValidationError
from pdfleet.lab import pki
from tests.unit.doctor.helpers import ClientFleet
from tests.unit.gateway.helpers import USER_KEY

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py


def test_key_shape() -> None:
    shape = key_shape("K", " " + USER_KEY + "\n")
    assert (shape.lead, shape.trail, shape.header_text) == (" ", "\n", False)
    assert shape.masked == "⎵sk-…cdef\\n" and USER_KEY not in repr(shape.masked)
    assert key_shape("K", "Bearer " + USER_KEY).header_text
    assert origin("http://h:8080/v1?x=1") == "http://h:8080"


def test_the_probes_of_the_openai_view(client_fleet: ClientFleet) -> None:
    facts = gather_client_facts(client_fleet.openai_base, USER_KEY, "K", False, {})
    assert [e.probe for e in facts.exchanges] == ["health", "version", "models", "chat", "chat_stream"]
    assert facts.models == ("llama",) and facts.model == "llama"
    assert facts.exchange("chat_stream").is_sse  # type: ignore[union-attr]


def test_the_probes_of_the_anthropic_view(client_fleet: ClientFleet) -> None:
    facts = gather_client_facts(client_fleet.anthropic_base, USER_KEY, "ANTHROPIC_API_KEY", True, {})
    probes = [e.probe for e in facts.exchanges]
    assert probes == ["health", "version", "models", "messages", "messages_stream", "messages_x_api_key"]
    sent = dict(facts.exchange("messages_x_api_key").request_headers)  # type: ignore[union-attr]
    assert sent["x-api-key"] == "sk-…cdef"


def test_nothing_after_a_refused_health_probe() -> None:
    facts = gather_client_facts(f"http://127.0.0.1:{free_port()}/v1", USER_KEY, "K", False, {})
    assert [e.probe for e in facts.exchanges] == ["health"]
    assert "refused" in (facts.exchanges[0].error or "").lower()


@pytest.mark.procs  # openssl makes the CA
def test_the_probes_trust_what_the_sdks_trust(tmp_path: Path) -> None:
    """SSL_CERT_FILE (else SSL_CERT_DIR) as the SDKs' httpx2 client reads it; the system's trust without;
    a variable naming no CA is an error naming it, not a probe that fails for another reason."""
    ca = pki.make_ca(tmp_path)
    trust = sdk_trust({"SSL_CERT_FILE": str(ca.cert)})
    assert isinstance(trust, ssl.SSLContext) and len(trust.get_ca_certs()) == 1
    assert sdk_trust({}) is True and sdk_trust({"SSL_CERT_FILE": ""}) is True
    with pytest.raises(ValidationError, match=f"SSL_CERT_FILE={tmp_path}/nope"):
        sdk_trust({"SSL_CERT_FILE": str(tmp_path / "nope")})

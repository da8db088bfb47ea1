"""Recorded exchanges: every secret masked in URL, headers and bodies; the helpers that read an answer."""

from __future__ import annotations

import httpx2

from pdfleet.doctor.exchange import Exchange, Recorder, by_probe
from tests.unit.doctor.helpers import ClientFleet
from tests.unit.gateway.helpers import USER_KEY


def test_a_recorded_exchange_holds_no_key(client_fleet: ClientFleet) -> None:
    rec = Recorder((USER_KEY,), probe="models")
    with httpx2.Client(event_hooks=rec.hooks(), trust_env=False) as http:
        http.post(
            f"{client_fleet.openai_base}/chat/completions?key={USER_KEY}",
            json={"echo": USER_KEY},
            headers={"Authorization": f"Bearer {USER_KEY}"},
        )
    ex = rec.finish("done")
    assert ex is not None and ex.status == 400  # the body has no model: the gateway's own 400
    text = str(ex.to_json()) + ex.evidence()
    assert USER_KEY not in text and "sk-…cdef" in text
    assert "json" in (ex.header("Content-Type") or "") and ex.header("CONTENT-TYPE") == ex.header(
        "content-type"
    )
    assert ex.error_message() and ex.outcome == "done"


def test_a_probe_that_was_never_sent_is_recorded_as_such() -> None:
    rec = Recorder((), probe="chat")
    ex = rec.finish("APIConnectionError", "Illegal header value")
    assert ex is not None and ex.url == "(not sent)" and ex.error == "Illegal header value"


def test_answer_helpers() -> None:
    body = '{"error": {"message": "m", "type": "t", "code": "c"}}'
    ex = Exchange(
        "p",
        "GET",
        "u",
        status=401,
        response_headers=(("Content-Type", "text/event-stream"),),
        response_body=body,
    )
    assert (ex.error_message(), ex.error_type(), ex.error_code(), ex.is_sse) == ("m", "t", "c", True)
    vllm = Exchange("p", "GET", "u", status=401, response_body='{"error":"Unauthorized"}')
    assert vllm.error_message() == "Unauthorized" and vllm.error_type() == ""
    assert Exchange("p", "GET", "u", response_body="<html>").body_json() is None
    assert by_probe([Exchange("a", "GET", "1"), Exchange("a", "GET", "2")])["a"].url == "2"

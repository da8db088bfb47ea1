"""The lab's notification recorder: keeps Alertmanager's webhook payloads in order and returns them;
refuses what is not one, without keeping it."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from pdfleet.bench.procs import free_port
from pdfleet.monitoring.notification_recorder import KEEP, Recorder, parse_notification, serve


@pytest.fixture
def url() -> Iterator[str]:
    port = free_port()
    server = serve("127.0.0.1", port)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}"
    server.shutdown()
    server.server_close()


def _call(url: str, body: bytes | None = None) -> tuple[int, object]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_notifications_are_kept_in_order_with_when_they_arrived(url: str) -> None:
    firing = {
        "status": "firing",
        "alerts": [{"labels": {"alertname": "PdfleetPoolDown"}, "status": "firing"}],
    }
    resolved = {**firing, "status": "resolved"}
    assert _call(f"{url}/alerts", json.dumps(firing).encode())[0] == 200
    assert _call(f"{url}/alerts", json.dumps(resolved).encode())[0] == 200
    status, kept = _call(f"{url}/alerts")
    assert status == 200 and isinstance(kept, list)
    assert [n["status"] for n in kept] == ["firing", "resolved"]
    assert kept[0]["received"] <= kept[1]["received"]
    assert _call(f"{url}/health") == (200, {"status": "ok"})


@pytest.mark.parametrize("body", [b"not json", b"[]", b'{"status": "firing"}', b'{"alerts": {}}'])
def test_what_is_not_a_notification_is_refused_and_not_kept(url: str, body: bytes) -> None:
    status, answer = _call(f"{url}/alerts", body)
    assert status == 400 and "webhook JSON" in str(answer)
    assert _call(f"{url}/alerts") == (200, [])
    assert _call(f"{url}/other", b"{}")[0] == 404 and _call(f"{url}/other")[0] == 404


def test_only_the_last_notifications_are_kept() -> None:
    kept = Recorder(keep=3)
    for n in range(5):
        kept.add({"alerts": [], "n": n})
    assert [x["n"] for x in kept.all()] == [2, 3, 4] and KEEP >= 100
    assert parse_notification(b'{"alerts": []}') == {"alerts": []}

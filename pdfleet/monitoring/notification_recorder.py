"""The lab's notification recorder: a webhook receiver that keeps what Alertmanager sends, so a test can
read which alerts were notified and resolved.

`POST /alerts` takes Alertmanager's webhook JSON (an object with `status` and `alerts`), keeps the last
KEEP of them in memory, each with the time it arrived (`received`, Unix seconds); `GET /alerts` returns
them, oldest first, as a JSON list; `GET /health` answers ok. Anything else is 404, a body that is not
such an object 400, a larger one than MAX_BODY 413. Standard library only: the monitoring role installs
this file as it is and systemd runs it with the host's python3, on the monitoring host's address (the
lab's bridge) only, for profiles that ask for it (`monitoring.alertmanager.lab_receiver`).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

KEEP = 1000
MAX_BODY = 1 << 20


class Recorder:
    """The notifications kept, newest last (thread-safe)."""

    def __init__(self, keep: int = KEEP) -> None:
        self._lock = threading.Lock()
        self._kept: deque[dict[str, Any]] = deque(maxlen=keep)

    def add(self, payload: dict[str, Any]) -> None:
        with self._lock:
            self._kept.append({**payload, "received": time.time()})

    def all(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._kept)


def parse_notification(body: bytes) -> dict[str, Any] | None:
    """Alertmanager's webhook payload, or None when the body is not one (an object with an alerts list)."""
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("alerts"), list):
        return None
    return doc


def handler_for(recorder: Recorder) -> type[BaseHTTPRequestHandler]:
    """The request handler of one recorder."""

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, status: int, doc: object) -> None:
            data = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path == "/alerts":
                self._answer(200, recorder.all())
            elif self.path == "/health":
                self._answer(200, {"status": "ok"})
            else:
                self._answer(404, {"error": f"no {self.path}: GET /alerts or /health"})

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            if self.path != "/alerts":
                self._answer(404, {"error": f"no {self.path}: POST /alerts"})
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                self._answer(413, {"error": f"a notification of {length} bytes (at most {MAX_BODY})"})
                return
            payload = parse_notification(self.rfile.read(length))
            if payload is None:
                self._answer(400, {"error": "not Alertmanager's webhook JSON (an object with alerts)"})
                return
            recorder.add(payload)
            self._answer(200, {"status": "recorded"})

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
            return  # one line per notification in the journal says nothing a GET does not

    return Handler


def serve(address: str, port: int, recorder: Recorder | None = None) -> ThreadingHTTPServer:
    """A server for `recorder` (a new one by default) bound to address:port, not yet serving."""
    return ThreadingHTTPServer((address, port), handler_for(recorder or Recorder()))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Keep Alertmanager's webhook notifications for tests.")
    parser.add_argument("--address", required=True, help="The address to listen on (the host's).")
    parser.add_argument("--port", type=int, required=True, help="The port to listen on.")
    args = parser.parse_args(argv)
    serve(args.address, args.port).serve_forever()


if __name__ == "__main__":
    main()

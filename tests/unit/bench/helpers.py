"""Loopback servers for the bench library's tests: a plain-text HTTP server."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def text_server(pages: dict[str, str]) -> Iterator[str]:
    """A threaded HTTP server on 127.0.0.1 answering GET PATH with pages[PATH] (else 404); its base URL."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            text = pages.get(self.path)
            self.send_response(200 if text is not None else 404)
            self.end_headers()
            self.wfile.write((text or "").encode())

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()

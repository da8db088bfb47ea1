"""The HTTP/1.1 response parser on its own: heads, framing decisions, chunked decoding and its errors."""

from __future__ import annotations

import pytest

from pdfleet.gateway.http1 import ResponseParser


class Recorder(ResponseParser):
    """A parser whose hooks record what it found, fed the way the connection feeds it."""

    def __init__(self) -> None:
        self._reset_parser()
        self.payload = bytearray()
        self.events: list[str] = []

    def feed(self, data: bytes) -> None:
        if not self.in_body:
            self.head += data
            if not self._parse_head():
                return
            data = bytes(self.head)
            self.head = bytearray()
        if data or (self.framing == "length" and self.remaining == 0):
            self._body(data)

    def _head_error(self, detail: str) -> None:
        self.events.append("head_error: " + detail)

    def _protocol_error(self) -> None:
        self.events.append("protocol_error")

    def _deliver(self, payload: bytes) -> None:
        self.payload += payload

    def _ended(self, tail: bytes, reason: None) -> None:
        self.payload += tail
        self.events.append("end")


def _parsed(*pieces: bytes) -> Recorder:
    p = Recorder()
    for piece in pieces:
        p.feed(piece)
    return p


def test_head_is_parsed_once_complete_and_interim_heads_are_skipped() -> None:
    p = _parsed(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nX-A:  1 \r\n", b"Content-Length: 2\r\n\r\n"
    )
    assert (p.status, p.headers, p.in_body) == (201, {"x-a": "1", "content-length": "2"}, True)
    assert (p.framing, p.remaining, p.content_length, p.keep_alive) == ("length", 2, 2, True)
    p.feed(b"ok")
    assert p.payload == b"ok" and p.events == ["end"]


@pytest.mark.parametrize(
    ("head", "framing", "keep_alive"),
    [
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", "chunked", True),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\n", "length", False),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\n", "length", False),
        (b"HTTP/1.1 200 OK\r\n\r\n", "close", False),
    ],
    ids=["chunked", "length-close", "http10", "close-delimited"],
)
def test_framing_and_keep_alive(head: bytes, framing: str, keep_alive: bool) -> None:
    p = _parsed(head)
    assert (p.framing, p.keep_alive) == (framing, keep_alive)


def test_no_body_responses_end_with_the_head() -> None:
    for head in (b"HTTP/1.1 204 No Content\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"):
        p = _parsed(head)
        assert p.events == ["end"] and p.payload == b""


@pytest.mark.parametrize(
    ("head", "fragment"),
    [
        (b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP/1.x response"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "malformed response header line"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "unsupported Transfer-Encoding"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "bad Content-Length"),
    ],
    ids=["not-http", "header-line", "te", "length"],
)
def test_bad_heads_are_refused(head: bytes, fragment: str) -> None:
    [event] = _parsed(head).events
    assert event.startswith("head_error: ") and fragment in event


_CTL = "a control character, bare CR or bare LF"
BAD_STATUS_AND_BYTES = [  # (id, head, fragment): what the gateway must not relay to its client
    ("status-000", b"HTTP/1.1 000 Zero\r\n\r\n", "outside 100-599"),
    ("status-099", b"HTTP/1.1 099 X\r\n\r\n", "outside 100-599"),
    ("status-999", b"HTTP/1.1 999 X\r\n\r\n", "outside 100-599"),
    ("status-4-digits", b"HTTP/1.1 2000 OK\r\n\r\n", "not an HTTP/1.x response"),
    ("version-1.7", b"HTTP/1.7 200 OK\r\n\r\n", "not an HTTP/1.x response"),
    ("header-bare-lf", b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\nX: 1\r\n\r\n", _CTL),
    ("header-bare-cr", b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\rX: 1\r\n\r\n", _CTL),
    ("header-nul", b"HTTP/1.1 200 OK\r\nContent-Type: text/\x00plain\r\n\r\n", _CTL),
    ("header-ctl", b"HTTP/1.1 200 OK\r\nContent-Encoding: gz\x01ip\r\n\r\n", _CTL),
    ("status-line-lf", b"HTTP/1.1 200 OK\nContent-Length: 0\r\n\r\n", _CTL),
    ("lf-only-head", b"HTTP/1.1 200 OK\nContent-Length: 0\n\n", _CTL),  # no CRLFCRLF ever comes
    ("obs-fold", b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n ; x=1\r\n\r\n", "malformed"),
    ("space-before-colon", b"HTTP/1.1 200 OK\r\nContent-Type : text/plain\r\n\r\n", "malformed"),
]


@pytest.mark.parametrize(
    ("head", "fragment"), [c[1:] for c in BAD_STATUS_AND_BYTES], ids=[c[0] for c in BAD_STATUS_AND_BYTES]
)
def test_heads_with_impossible_status_or_control_bytes_are_refused(head: bytes, fragment: str) -> None:
    events = _parsed(head).events
    assert events and all(e.startswith("head_error: ") for e in events) and fragment in events[0]


def test_a_head_split_between_cr_and_lf_is_not_a_bare_cr() -> None:
    p = _parsed(b"HTTP/1.1 200 OK\r", b"\nX-Tab: a\tb\r\nContent-Length: 0\r", b"\n\r\n")
    assert p.events == ["end"] and p.headers == {"x-tab": "a\tb", "content-length": "0"}
    assert _parsed(b"HTTP/1.1 204\r\n\r\n").events == ["end"]  # no reason phrase is fine


def test_chunked_payload_across_reads_with_extensions_and_trailers() -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    wire = head + b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nT: x\r\n\r\n"
    p = _parsed(*(wire[i : i + 3] for i in range(0, len(wire), 3)))
    assert p.payload == b"hello world" and p.events == ["end"] and p.chunk_state == 3


@pytest.mark.parametrize(
    "body",
    [b"zz\r\n", b"-5\r\nhello\r\n", b"1" * 5000, b"0\r\n\r\nextra"],
    ids=["not-hex", "negative", "endless-size-line", "bytes-after-end"],
)
def test_broken_chunked_framing_is_a_protocol_error(body: bytes) -> None:
    p = _parsed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body)
    assert p.events[-1] == "protocol_error"


def test_more_bytes_than_the_content_length_is_a_protocol_error() -> None:
    p = _parsed(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n", b"abc")
    assert p.events == ["protocol_error"] and p.payload == b""

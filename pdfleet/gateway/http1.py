"""HTTP/1.1 response parsing for the upstream connection: the head, how the body is framed, chunked decoding.

Only what pools speak: HTTP/1.1 (or 1.0) responses framed by chunked encoding, Content-Length or
connection close; 1xx interim heads are skipped, trailers ignored. `ResponseParser` is a mixin of the
connection (connection.py), so the per-chunk path touches no extra object and makes no extra call:
its state lives on the connection, and it hands results to the connection's hooks.
"""

from __future__ import annotations

MAX_HEAD = 64 * 1024
# every control byte but HTAB (CR and LF included): none may be left once the CRLF pairs are taken out
_CTL = bytes([*range(0x00, 0x09), *range(0x0A, 0x20), 0x7F])


def bad_head_bytes(block: bytes) -> bool:
    """Whether a response head holds a control byte other than HTAB, or a CR or LF outside a CRLF pair.

    (A bytes replace and translate: ~10x cheaper than a regular expression with look-arounds.)
    """
    rest = block.replace(b"\r\n", b"")
    return len(rest.translate(None, _CTL)) != len(rest)


class ResponseParser:
    """Parses one response at a time; the subclass says what happens with its head, payload and end."""

    def _reset_parser(self) -> None:
        """State of a new response."""
        self.head = bytearray()
        self.in_body = False
        self.framing = "close"  # chunked | length | close
        self.remaining = 0  # length: body bytes left; chunked: bytes left of this chunk + its CRLF
        self.chunk_state = 0  # chunked framing: 0 size line, 1 data, 2 trailers, 3 done
        self.line = bytearray()  # a chunk-size or trailer line split across reads
        self.keep_alive = True
        self.status = 0
        self.headers: dict[str, str] = {}
        self.content_length: int | None = None

    # ---- hooks the connection implements ---------------------------------------------------------

    def _head_error(self, detail: str) -> None:
        """The head is not one this parser takes."""
        raise NotImplementedError

    def _protocol_error(self) -> None:
        """The body's framing is broken."""
        raise NotImplementedError

    def _deliver(self, payload: bytes) -> None:
        """A piece of body payload (never empty)."""
        raise NotImplementedError

    def _ended(self, tail: bytes, reason: None) -> None:
        """The body ended cleanly with `tail` as its last payload (may be empty)."""
        raise NotImplementedError

    # ---- head ------------------------------------------------------------------------------------

    def _parse_head(self) -> bool:
        """Parse the status line and headers once the blank line arrived; skip 1xx interim heads."""
        while True:
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                # a head with bare LF line ends never gets its CRLFCRLF: refuse it now, not at the timeout
                # (a CR as the last byte may have its LF still on the way)
                if bad_head_bytes(bytes(self.head[:-1] if self.head.endswith(b"\r") else self.head)):
                    self._head_error("a control character, bare CR or bare LF in the response head")
                return False
            block = bytes(self.head[:end])
            del self.head[: end + 4]
            if bad_head_bytes(block):
                # a bare CR or LF splits a header in two for some parsers and not others (smuggling),
                # and none of these bytes may be relayed in a header to the client
                self._head_error("a control character, bare CR or bare LF in the response head")
                return False
            lines = block.decode("latin-1").split("\r\n")
            version, _, rest = lines[0].partition(" ")
            code = rest[:3]
            if version not in ("HTTP/1.1", "HTTP/1.0") or not code.isdigit() or rest[3:4] not in ("", " "):
                self._head_error(f"not an HTTP/1.x response: {lines[0][:80]!r}")
                return False
            status = int(code)
            if not 100 <= status <= 599:
                self._head_error(f"status {code} is outside 100-599")
                return False
            if status < 200:
                continue
            if b"\n " in block or b"\n\t" in block:  # a folded continuation line (obs-fold)
                self._head_error("malformed response header line")
                return False
            headers: dict[str, str] = {}
            for line in lines[1:]:
                name, sep, value = line.partition(":")
                if not sep or name[-1:] in " \t":  # no colon, no name, or space before the colon
                    self._head_error("malformed response header line")
                    return False
                headers[name.lower()] = value.strip(" \t")
            return self._framing(version, status, headers)

    def _framing(self, version: str, status: int, headers: dict[str, str]) -> bool:
        """Decide how the body ends (chunked, Content-Length, close) and whether the connection stays."""
        self.status, self.headers, self.in_body = status, headers, True
        self.keep_alive = version == "HTTP/1.1" and "close" not in headers.get("connection", "").lower()
        te = headers.get("transfer-encoding", "").lower()
        if te:
            if te.rsplit(",", 1)[-1].strip() != "chunked":
                self._head_error(f"unsupported Transfer-Encoding {te!r}")
                return False
            self.framing = "chunked"
        elif status in (204, 304):
            self.framing, self.remaining, self.content_length = "length", 0, 0
        elif "content-length" in headers:
            cl = headers["content-length"]
            if not cl.isdigit():
                self._head_error(f"bad Content-Length {cl!r}")
                return False
            self.framing, self.remaining = "length", int(cl)
            self.content_length = self.remaining
        else:
            self.framing, self.keep_alive = "close", False
        return True

    # ---- body ------------------------------------------------------------------------------------

    def _body(self, data: bytes) -> None:
        """Take body bytes off the wire framing and pass the payload on."""
        if self.framing == "chunked":
            pieces = self._dechunk(data)
            if pieces is None:
                return
            payload = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            done = self.chunk_state == 3
        elif self.framing == "length":
            if len(data) > self.remaining:
                self._protocol_error()
                return
            self.remaining -= len(data)
            payload, done = data, self.remaining == 0
        else:
            payload, done = data, False
        if done:
            self._ended(payload, None)
        elif payload:
            self._deliver(payload)

    def _dechunk(self, data: bytes) -> list[bytes] | None:
        """Payload slices of chunked-encoded `data` (None after a framing error); state 3 at the end."""
        out: list[bytes] = []
        i, n = 0, len(data)
        while i < n:
            st = self.chunk_state
            if st == 1:  # chunk data, then its CRLF (both counted in remaining)
                take = min(self.remaining, n - i)
                data_part = min(take, self.remaining - 2)
                if data_part > 0:
                    out.append(data[i : i + data_part])
                self.remaining -= take
                i += take
                if self.remaining == 0:
                    self.chunk_state = 0
                continue
            if st == 3:  # bytes after the message: not something a pool sends
                self._protocol_error()
                return None
            j = data.find(b"\n", i)
            if j < 0:
                self.line += data[i:]
                if len(self.line) > 4096:  # a chunk-size line is a few bytes
                    self._protocol_error()
                    return None
                return out
            if self.line:
                self.line += data[i:j]
                line = bytes(self.line).rstrip(b"\r")
                self.line.clear()
            else:
                line = data[i:j].rstrip(b"\r")
            i = j + 1
            if st == 0:
                try:
                    size = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    self._protocol_error()
                    return None
                if size < 0:
                    self._protocol_error()
                    return None
                self.chunk_state, self.remaining = (2, 0) if size == 0 else (1, size + 2)
            elif not line:  # st == 2: the blank line after the (ignored) trailers
                self.chunk_state = 3
        return out

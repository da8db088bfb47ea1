"""Traffic capture (issue 33): the shape of live traffic, never its content, as Mooncake trace lines.

One line per proxied request, written when it ends (its output length is known then), in the format
pdfleet.bench.trace reads: `timestamp` (ms since the capture started, at the request's arrival),
`input_length` (estimated prompt tokens), `output_length`, `hash_ids`, and pdfleet's `model` (the alias
asked for), `class` and `effective_tokens`. `hash_ids` are the prompt's chained 512-token block hashes
remapped to 0, 1, 2, ... in order of first sight (as Mooncake published its own), so two requests share
ids exactly as they share prefixes, and no id can be checked against a guessed text. Nothing of a
prompt or a completion is written: the output length is counted from the relayed events and read from
the upstream's `usage.completion_tokens` when it sends one.

Off while the policy's `capture.path` is unset. The file is created 0600 (a trace is the shape of
someone's traffic); past `max_bytes` it is rotated (`path` -> `path.1` -> ... -> `path.<files-1>`, the
oldest removed). Writes are small appends from the event loop; a write that fails (disk full) turns the
capture off with one log line, never failing the request.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from pathlib import Path
from typing import IO, Any

from pdfleet.gateway.policy_spec import CaptureSpec
from pdfleet.gateway.prefix_index import prompt_blocks, prompt_text

log = logging.getLogger("pdfleet.gateway")

BLOCK_TOKENS = 512  # Mooncake: one hash id per 512-token prefix block
MAX_IDS = 1_000_000  # remapped blocks remembered; past it the map starts afresh (ids keep rising)
_USAGE = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
_TAIL = 512  # bytes of the body's end kept to read usage from (in memory only, never written)


class OutputCounter:
    """A client transport's stand-in for the relay: passes every write on, counting the SSE events
    (`data:` lines but `[DONE]`) and keeping the body's last bytes for the usage figure."""

    __slots__ = ("transport", "events", "tail")

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self.events = 0
        self.tail = b""

    def feed(self, data: bytes) -> None:
        """Count a piece the gateway wrote itself (the first chunk)."""
        if data:
            self.events += data.count(b"data:") - data.count(b"data: [DONE]")
            self.tail = (self.tail + data)[-_TAIL:]

    def write(self, data: bytes) -> None:
        self.transport.write(data)
        self.feed(data)

    def is_closing(self) -> bool:
        return bool(self.transport.is_closing())

    def get_write_buffer_size(self) -> int:
        return int(self.transport.get_write_buffer_size())

    def output_tokens(self) -> int:
        """The upstream's own count when its usage came last, else the content events relayed (one
        token each, as vLLM streams), less a trailing usage event."""
        found = _USAGE.findall(self.tail)
        if found:
            return int(found[-1])
        return max(0, self.events)


class Capture:
    """The rotating trace file of one gateway; `configure` follows the policy (path, bounds)."""

    def __init__(self) -> None:
        self.spec = CaptureSpec()
        self.path: Path | None = None
        self._out: IO[str] | None = None
        self._size = 0
        self._ids: dict[int, int] = {}
        self._next_id = 0
        self.t0 = time.perf_counter()  # timestamps count from the capture's start
        self.written = 0

    @property
    def on(self) -> bool:
        return self.path is not None

    def configure(self, spec: CaptureSpec, policy_dir: Path) -> None:
        """Apply a policy's capture settings: a new path starts a new capture (a new time origin)."""
        path = None if spec.path is None else (policy_dir / Path(spec.path).expanduser())
        if path != self.path:
            self.close()
            self.path = path
            self.t0 = time.perf_counter()
            self._ids.clear()
            self._next_id = 0
        self.spec = spec

    def close(self) -> None:
        """Close the file (a capture turned off, the gateway stopping)."""
        out, self._out = self._out, None
        if out is not None:
            out.close()

    def record(self, ctx: Any, output_tokens: int, chars_per_token: float) -> None:
        """Append one request's shape (a RequestContext; typed Any: context imports the policy)."""
        if self.path is None:
            return
        blocks = prompt_blocks(prompt_text(ctx.data, ctx.endpoint), BLOCK_TOKENS, chars_per_token)
        line = {
            "timestamp": max(0, round((ctx.t0 - self.t0) * 1000)),
            "input_length": max(1, ctx.tokens),
            "output_length": max(0, output_tokens),
            "hash_ids": [self._id(b) for b in blocks],
            "model": ctx.alias,
            "class": ctx.cls,
            "effective_tokens": ctx.decision.effective,
        }
        try:
            self._write(json.dumps(line, separators=(", ", ": ")) + "\n")
        except OSError as err:
            log.error("traffic capture to %s failed, capture off until a reload: %s", self.path, err)
            self.close()
            self.path = None

    def _id(self, block: int) -> int:
        """A block hash's published id: 0, 1, 2, ... in order of first sight."""
        found = self._ids.get(block)
        if found is None:
            if len(self._ids) >= MAX_IDS:
                self._ids.clear()
            found = self._ids[block] = self._next_id
            self._next_id += 1
        return found

    def _write(self, text: str) -> None:
        data = text.encode()
        if self._out is not None and self._size + len(data) > self.spec.max_bytes:
            self._rotate()
        if self._out is None:
            self._open()
        assert self._out is not None
        self._out.write(text)
        self._out.flush()
        self._size += len(data)
        self.written += 1

    def _open(self) -> None:
        assert self.path is not None
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.fchmod(fd, 0o600)  # an existing file made by someone else's umask: 0600 all the same
        self._out = os.fdopen(fd, "a", encoding="utf-8")
        self._size = os.fstat(fd).st_size

    def _rotate(self) -> None:
        """path -> path.1 -> ... -> path.<files-1>; the oldest goes."""
        assert self.path is not None
        self.close()
        keep = self.spec.files - 1
        if keep <= 0:
            self.path.unlink(missing_ok=True)
            return
        Path(f"{self.path}.{keep}").unlink(missing_ok=True)
        for k in range(keep - 1, 0, -1):
            older = Path(f"{self.path}.{k}")
            if older.exists():
                older.replace(f"{self.path}.{k + 1}")
        self.path.replace(f"{self.path}.1")

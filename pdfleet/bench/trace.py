"""Mooncake's published trace format (kvcache-ai/Mooncake FAST25-release/traces/*.jsonl), read and written.

JSON Lines, one request a line: `timestamp` (ms since the trace's start), `input_length` and
`output_length` (tokens), `hash_ids` (one id per 512-token prefix block, chained: two requests share
their first k ids iff they share their first k blocks of prompt). pdfleet adds optional keys a capture
knows and a planner can use: `model` (the name the client asked for), `class` (the gateway's length
class, `short`/`long`) and `effective_tokens` (prompt tokens the gateway estimated were not cached where
it routed the request, issue 32). Other keys on a line are ignored, so traces written by other tools
(aiperf, guidellm) read too. No key ever holds prompt or completion text.

The API is `read_trace(path) -> list[TraceRequest]` and `write_trace(path, requests)`; the bench's
`trace` workload, the gateway's capture (issue 33) and the planner (issue 34) share it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic import ValidationError as PydanticValidationError

from pdfleet.errors import ValidationError
from pdfleet.model.schema_errors import schema_problems

BLOCK_TOKENS = 512  # Mooncake: one hash_id per 512-token prefix block
MAX_LINE_CHARS = 4_000_000  # ~400K hash ids: a line past it is not a request (and would be read whole)


class TraceRequest(BaseModel):
    """One request of a trace: when it arrived, its prompt and output lengths and its prefix blocks."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True, populate_by_name=True)

    timestamp: float = Field(ge=0)  # ms since the trace's start (Mooncake writes integers)
    input_length: int = Field(ge=1)
    output_length: int = Field(ge=0)  # 0: a captured request that ended before its first token
    hash_ids: tuple[int, ...] = ()
    # pdfleet's optional keys (absent from Mooncake's files)
    model: str | None = Field(None, min_length=1, max_length=200)
    length_class: Literal["short", "long"] | None = Field(None, alias="class")
    effective_tokens: int | None = Field(None, ge=0)

    def line(self) -> str:
        """The request as one JSON line (no newline): Mooncake's four keys first, pdfleet's when set."""
        data = self.model_dump(by_alias=True, exclude_none=True)
        data["hash_ids"] = list(self.hash_ids)
        if float(self.timestamp).is_integer():
            data["timestamp"] = int(self.timestamp)  # as Mooncake writes it
        return json.dumps(data, separators=(", ", ": "))


def parse_line(line: str, where: str) -> TraceRequest:
    """One trace line as a TraceRequest, or a ValidationError starting with `where` (`file:line`)."""
    if len(line) > MAX_LINE_CHARS:
        raise ValidationError(f"{where}: a line of {len(line)} characters is not a trace request")
    try:
        data = json.loads(line)
    except ValueError:
        raise ValidationError(f"{where}: not a JSON line") from None
    if not isinstance(data, dict):
        raise ValidationError(
            f"{where}: a trace line is a JSON object (timestamp, input_length, output_length, hash_ids)"
        )
    if isinstance(data.get("hash_ids"), list):
        data["hash_ids"] = tuple(data["hash_ids"])  # strict mode takes a tuple field only as a tuple
    try:
        return TraceRequest.model_validate(data)
    except PydanticValidationError as exc:
        raise ValidationError("; ".join(schema_problems(exc, TraceRequest, Path(where)))) from None


def read_trace(path: Path | str, limit: int | None = None) -> list[TraceRequest]:
    """The requests of a trace file in arrival order (a capture writes each request when it ends, so
    lines may be out of order; equal timestamps keep the file's order). `limit`: stop after that many
    lines with a request. Blank lines are skipped; a bad line is a ValidationError naming `file:line`
    and the key; a file with no request or that cannot be read is one too."""
    path = Path(path).expanduser()
    requests: list[TraceRequest] = []
    try:
        with path.open(encoding="utf-8") as lines:
            for lineno, line in enumerate(lines, 1):
                if limit is not None and len(requests) >= limit:
                    break
                if line.strip():
                    requests.append(parse_line(line, f"{path}:{lineno}"))
    except OSError as err:
        raise ValidationError(f"{path}: cannot read the trace ({err.strerror})") from None
    except UnicodeDecodeError:
        raise ValidationError(f"{path}: not a text file (a trace is UTF-8 JSON Lines)") from None
    if not requests:
        raise ValidationError(f"{path}: the trace has no request")
    return sorted(requests, key=lambda r: r.timestamp)


def write_trace(path: Path | str, requests: Iterable[TraceRequest]) -> int:
    """Write requests as a trace file, 0600 from its creation (a trace is the shape of someone's traffic),
    replacing the file atomically; the number of lines written."""
    path = Path(path).expanduser()
    tmp = path.with_name(f".{path.name}.tmp")
    count = 0
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            for request in requests:
                out.write(request.line() + "\n")
                count += 1
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return count


def duration_s(requests: list[TraceRequest]) -> float:
    """Seconds from the first arrival to the last (0 for one request)."""
    return (requests[-1].timestamp - requests[0].timestamp) / 1000 if requests else 0.0

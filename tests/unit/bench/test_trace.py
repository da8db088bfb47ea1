"""Mooncake traces: the published lines read as they are, pdfleet's optional keys round-trip, a bad line
is one error naming file:line and the key, and a written trace is 0600 and reads back equal."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from pdfleet.bench.trace import TraceRequest, duration_s, read_trace, write_trace
from pdfleet.errors import ValidationError

# Two lines as kvcache-ai/Mooncake FAST25-release/traces/conversation_trace.jsonl writes them
MOONCAKE = (
    '{"timestamp": 0, "input_length": 2290, "output_length": 316, "hash_ids": [0, 42, 43, 44, 45]}\n'
    '{"timestamp": 3000, "input_length": 915, "output_length": 355, "hash_ids": [0, 462]}\n'
)


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text(text)
    return path


def test_mooncake_lines_read_with_their_fields(tmp_path: Path) -> None:
    a, b = read_trace(_file(tmp_path, MOONCAKE))
    assert (a.timestamp, a.input_length, a.output_length, a.hash_ids) == (0, 2290, 316, (0, 42, 43, 44, 45))
    assert (b.timestamp, b.hash_ids) == (3000, (0, 462)) and b.model is None and b.length_class is None
    assert duration_s([a, b]) == 3.0


def test_a_mooncake_request_writes_back_as_the_same_line(tmp_path: Path) -> None:
    requests = read_trace(_file(tmp_path, MOONCAKE))
    assert "".join(r.line() + "\n" for r in requests) == MOONCAKE


def test_pdfleet_keys_round_trip_and_the_file_is_0600(tmp_path: Path) -> None:
    requests = [
        TraceRequest(
            timestamp=12.5,
            input_length=20000,
            output_length=0,
            hash_ids=(1, 2),
            model="m",
            length_class="long",
            effective_tokens=19000,
        ),
        TraceRequest(timestamp=3, input_length=10, output_length=4),
    ]
    path = tmp_path / "out.jsonl"
    assert write_trace(path, requests) == 2
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text().splitlines()[0])["class"] == "long"
    assert read_trace(path) == sorted(requests, key=lambda r: r.timestamp)  # arrival order
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_limit_and_blank_lines_and_other_tools_keys(tmp_path: Path) -> None:
    text = '\n{"timestamp": 5, "input_length": 3, "output_length": 1, "session_id": "s"}\n' + MOONCAKE
    assert [r.timestamp for r in read_trace(_file(tmp_path, text), limit=2)] == [0, 5]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"timestamp": 1, "output_length": 3}', "t.jsonl:2: input_length: required key is missing"),
        ('{"timestamp": 1, "input_length": "9", "output_length": 3}', "t.jsonl:2: input_length:"),
        ('{"timestamp": 1, "input_length": 0, "output_length": 3}', "t.jsonl:2: input_length:"),
        ('{"timestamp": -1, "input_length": 9, "output_length": 3}', "t.jsonl:2: timestamp:"),
        ('{"timestamp": 1, "input_length": true, "output_length": 3}', "t.jsonl:2: input_length:"),
        ('{"timestamp": 1, "input_length": 9, "output_length": 3, "hash_ids": [1, "a"]}', ":2: hash_ids"),
        ('{"timestamp": 1, "input_length": 9, "output_length": 3, "class": "huge"}', "t.jsonl:2: class:"),
        ("[1, 2]", "t.jsonl:2: a trace line is a JSON object"),
        ("not json", "t.jsonl:2: not a JSON line"),
    ],
)
def test_a_bad_line_names_file_line_and_key(tmp_path: Path, line: str, message: str) -> None:
    path = _file(tmp_path, MOONCAKE.splitlines(keepends=True)[0] + line + "\n")
    with pytest.raises(ValidationError, match=message):
        read_trace(path)


def test_an_empty_or_missing_or_binary_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="t.jsonl: the trace has no request"):
        read_trace(_file(tmp_path, "\n\n"))
    with pytest.raises(ValidationError, match="nope.jsonl: cannot read the trace"):
        read_trace(tmp_path / "nope.jsonl")
    (tmp_path / "b").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValidationError, match="b: not a text file"):
        read_trace(tmp_path / "b")

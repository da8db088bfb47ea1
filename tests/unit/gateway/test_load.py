"""The load facts: `vllm:num_requests_waiting` read from an exposition (summed over engines, its
`_by_reason` sibling ignored), a failed scrape turning the figure unknown at once, and outstanding
prompt tokens per colocated instance."""

from __future__ import annotations

from pdfleet.gateway.decider import Load
from pdfleet.gateway.load import Outstanding, QueueWatch, parse_waiting

EXPOSITION = """# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3 8B"} 3.0
vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen3 8B"} 2.0 1733140000000
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 40.0
vllm:num_requests_running{engine="0",model_name="m"} 7.0
"""


def test_parse_waiting_sums_engines_and_skips_other_series() -> None:
    assert parse_waiting(EXPOSITION) == 5
    assert parse_waiting("vllm:num_requests_waiting 4\n") == 4
    assert parse_waiting("vllm:num_requests_running 4\n") is None  # not exported: unknown, not 0
    assert parse_waiting("") is None


def test_a_failed_scrape_makes_the_figure_unknown_at_once() -> None:
    watch = QueueWatch()
    watch.watch(["http://p1", "http://p2"])
    assert watch.load("http://p1") == Load(None, None)
    watch.saw("http://p1", 3, at=100.0)
    assert watch.load("http://p1", now=100.5) == Load(3, 0.5)
    watch.saw("http://p1", None, at=101.0)
    assert watch.load("http://p1", now=101.0) == Load(None, None)
    watch.saw("http://p2", 1, at=100.0)
    watch.watch(["http://p1"])  # a reload that drops p2 forgets its figure
    assert watch.load("http://p2", now=100.0) == Load(None, None)


def test_outstanding_tokens_add_up_and_drain() -> None:
    out = Outstanding()
    out.add("a", 100)
    out.add("a", 50)
    out.add("b", 7)
    assert out.of(["a", "b", "c"]) == [150, 7, 0]
    out.done("a", 100)
    out.done("b", 7)
    assert out.of(["a", "b"]) == [50, 0] and "b" not in out.tokens


def test_requests_served_count_those_prefilling_and_those_decoding() -> None:
    out = Outstanding()
    out.add("a", 100)  # sent: prefilling
    out.stream("a")
    out.stream("b")
    assert out.serving(["a", "b", "c"]) == [2, 1, 0]
    out.done("a", 100)  # its first byte: the proxy counts its stream from here
    out.stream("a")
    out.ended("a")
    out.ended("b")
    out.ended("b")  # an extra end never goes negative
    assert out.serving(["a", "b"]) == [1, 0] and "b" not in out.streams and out.prefilling == {}

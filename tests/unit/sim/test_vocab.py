"""Output tokens from the tokenizer's vocabulary: streamed text re-tokenizes to the reported count."""

from __future__ import annotations

import logging
from pathlib import Path

import openai
import pytest
from tokenizers import Tokenizer

from pdfleet.bench.launch import SimProcess
from pdfleet.sim.stream import DEFAULT_FILLER, FILLER
from pdfleet.sim.vocab import choose_filler, filler_for
from tests.unit.sim.helpers import MODEL, make_tokenizer

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py


def _count(tok: Tokenizer, text: str) -> int:
    return len(tok.encode(text, add_special_tokens=False).ids)


@pytest.mark.parametrize("vocab_size", [300, 262], ids=["filler-words", "vocabulary-search"])
def test_the_filler_re_tokenizes_to_its_length(tmp_path: Path, vocab_size: int) -> None:
    tok = Tokenizer.from_file(str(make_tokenizer(tmp_path / "tokenizer.json", vocab_size)))
    filler = choose_filler(tok)
    assert filler is not DEFAULT_FILLER
    assert all(_count(tok, filler.text(n)) == n for n in range(1, 300))
    assert all(_count(tok, w) == 1 and '"' not in w and "\\" not in w for w in filler.words)
    assert _count(tok, DEFAULT_FILLER.text(128)) != 128  # the reason for all this


def test_a_vocabulary_without_clean_tokens_keeps_the_filler_words_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tok = Tokenizer.from_file(str(make_tokenizer(tmp_path / "tokenizer.json", 120)))  # bytes, few merges
    with caplog.at_level(logging.WARNING, logger="pdfleet.sim"):
        assert choose_filler(tok) is DEFAULT_FILLER
    assert "will not get usage.completion_tokens" in caplog.text


def test_without_a_tokenizer_the_filler_words_are_used() -> None:
    assert filler_for(None) is DEFAULT_FILLER and DEFAULT_FILLER.words == FILLER


def test_streamed_and_whole_text_re_tokenize_to_the_reported_count(tmp_path: Path) -> None:
    path = make_tokenizer(tmp_path / "tokenizer.json")
    tok = Tokenizer.from_file(str(path))
    with SimProcess([MODEL, "--tokenizer", str(path), "--sim-time-scale", "0.05"]) as sim:
        client = openai.OpenAI(base_url=sim.url + "/v1", api_key="unused", max_retries=0, timeout=30)
        chunks = list(
            client.completions.create(
                model=MODEL,
                prompt="the quick brown fox",
                max_tokens=128,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        whole = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=57
        )
    pieces = [c.choices[0].text for c in chunks if c.choices]
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 128 == len(pieces)
    assert all(_count(tok, p) == 1 for p in pieces)  # every chunk is one token of the vocabulary
    assert _count(tok, "".join(pieces)) == 128  # and the text re-tokenizes to the count
    assert whole.usage is not None and whole.usage.completion_tokens == 57
    assert _count(tok, whole.choices[0].message.content or "") == 57

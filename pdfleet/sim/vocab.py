"""Output tokens from the tokenizer's vocabulary, so streamed text re-tokenizes to the reported count.

A client that counts tokens itself (re-tokenizing the streamed text) must get `usage.completion_tokens`.
So with a tokenizer each streamed piece is one vocabulary token, and the pieces are chosen so that no two
neighbours merge or split when the text is tokenized again: the filler words where they are single tokens
of this vocabulary, else tokens found in the vocabulary; the cycle is checked end to end before use.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from pdfleet.sim.stream import DEFAULT_FILLER, FILLER, Filler

log = logging.getLogger("pdfleet.sim")

MIN_CYCLE = 4  # fewer filler words than this survive: look for more in the vocabulary
MAX_CYCLE = 24


def filler_for(tokenizer_file: str | None) -> Filler:
    """The filler for a tokenizer.json (the default words when there is none)."""
    if not tokenizer_file:
        return DEFAULT_FILLER
    from tokenizers import Tokenizer  # the optional extra; pdfleet.tokens has already required it

    return choose_filler(Tokenizer.from_file(tokenizer_file))


def _ids(tok: Any, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False).ids)


def _json_safe(text: str) -> bool:
    """Goes into a JSON string unescaped: no quote, backslash or control character."""
    return bool(text) and not any(c in '"\\' or ord(c) < 0x20 or ord(c) == 0x7F for c in text)


def _single(tok: Any, text: str) -> bool:
    return _json_safe(text) and len(_ids(tok, text)) == 1


def _vocabulary_words(tok: Any) -> Iterable[str]:
    """Vocabulary tokens as text, those starting with a space first (they rarely merge with a neighbour)."""
    later = []
    for tid in range(tok.get_vocab_size()):
        text = tok.decode([tid])
        if len(text.strip()) < 2 or not text.isprintable():
            continue
        if text.startswith(" "):
            yield text
        else:
            later.append(text)
    yield from later


def _cycle(tok: Any, words: Sequence[str]) -> list[str]:
    """Words in order such that each neighbour pair (the last and the first too) stays two tokens."""
    out: list[str] = []
    for w in words:
        if w in out:
            continue
        if not out or len(_ids(tok, out[-1] + w)) == 2:
            out.append(w)
        if len(out) == MAX_CYCLE:
            break
    while len(out) > 1 and len(_ids(tok, out[-1] + out[0])) != 2:
        out.pop()
    return out


def _holds(tok: Any, filler: Filler) -> bool:
    """The streamed text of n tokens re-tokenizes to n tokens, for every n over two whole cycles."""
    return all(len(_ids(tok, filler.text(n))) == n for n in range(1, 2 * len(filler.words) + 2))


def choose_filler(tok: Any) -> Filler:
    """A filler whose text re-tokenizes to its token count with `tok` (a `tokenizers.Tokenizer`)."""
    words = [w for w in FILLER if _single(tok, w)]
    if len(set(words)) < MIN_CYCLE:
        found = (w for w in _vocabulary_words(tok) if _single(tok, w))
        words += [w for _, w in zip(range(4 * MAX_CYCLE), found, strict=False)]
    cycle = _cycle(tok, words)
    if cycle:
        filler = Filler(tuple(cycle))
        if _holds(tok, filler):
            return filler
    for w in dict.fromkeys(words):  # a single token that repeats cleanly
        one = Filler((w,))
        if _holds(tok, one):
            return one
    log.warning(
        "pdfleet-sim: no tokens of this tokenizer re-tokenize cleanly when streamed; output text is "
        "filler words and a client re-tokenizing it will not get usage.completion_tokens"
    )
    return DEFAULT_FILLER

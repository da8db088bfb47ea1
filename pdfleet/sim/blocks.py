"""An instance's KV blocks with vLLM's automatic prefix cache (v1 `BlockPool` / `KVCacheManager`).

A full block of prompt tokens is named by a hash chained over every block before it, so two prompts
share a block only when they share everything up to its end. A block keeps its hash after its requests
free it, on a free queue that hands out the least recently freed block first (a request's blocks are
freed tail first, so a prompt's end is evicted before its start); a block handed out again loses its
hash. That is the whole eviction rule: the cache is bounded by the instance's KV blocks, nothing else.

`block_hashes(units, block_size)` chains the hashes of a prompt's tokens (ids, or the text pieces the
character estimate counts as tokens); `prompt_units` lays a request body out as those tokens, in the
order and number `pdfleet.tokens` counts them: with the model's chat template, a chat prompt's rendered
ids (what vLLM prefills, and what its KV events carry).
"""

from __future__ import annotations

import hashlib
import math
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from itertools import accumulate
from typing import Any, cast

from pdfleet.tokens import TOKENS_PER_CHAT_MESSAGE, HFTokenizer, TextCounter, _content_text, chat_ids

Unit = int | str
# what stands for the chat template's role markers (TOKENS_PER_CHAT_MESSAGE per message)
_MARKER = "\0role-marker"


class OnceCounter:
    """A tokenizer that encodes each text of one request once: validating counts the prompt and the prefix
    cache hashes its token ids, and both read them from here (a 25K-token prompt was tokenized twice)."""

    def __init__(self, tokenizer: HFTokenizer) -> None:
        self._tokenizer = tokenizer
        self._ids: dict[str, list[int]] = {}
        self._chat: tuple[list[int] | None] | None = None  # the request's chat prompt ids, once rendered

    def encode(self, text: str) -> list[int]:
        """The text's token ids (encoded on first use)."""
        ids = self._ids.get(text)
        if ids is None:
            ids = self._ids[text] = self._tokenizer.encode(text)
        return ids

    def count(self, text: str) -> int:
        """As HFTokenizer.count, from the same ids."""
        return len(self.encode(text))

    def chat_ids(self, body: dict[str, Any]) -> list[int] | None:
        """As HFTokenizer.chat_ids, rendered and encoded once (the one request's body)."""
        if self._chat is None:
            self._chat = (self._tokenizer.chat_ids(body),)
        return self._chat[0]


def once(counter: TextCounter) -> TextCounter:
    """The counter one request's intake uses: a tokenizer remembers what it encoded, an estimate is cheap."""
    return OnceCounter(counter) if isinstance(counter, HFTokenizer) else counter


def _text_units(text: str, counter: TextCounter) -> list[Unit]:
    """The tokens of a text: the tokenizer's ids, or the estimate's chars_per_token-long pieces."""
    if not text:
        return []
    if isinstance(counter, HFTokenizer | OnceCounter):
        return list(counter.encode(text))
    n = counter.count(text)
    if len(text) % n == 0:  # pieces of one width (floor(i * step) is i * width exactly): slice by it
        width = len(text) // n
        return [text[i : i + width] for i in range(0, len(text), width)]
    step = len(text) / n
    cuts = [math.floor(i * step) for i in range(n + 1)]
    return [text[a:b] for a, b in zip(cuts, cuts[1:], strict=False)]


def prompt_units(body: dict[str, Any], counter: TextCounter) -> list[Unit]:
    """A request's prompt as tokens, laid out as `pdfleet.tokens.count_request_tokens` counts them."""
    if "messages" in body:
        ids = chat_ids(body, counter)  # the model's chat template rendered: the engine's own ids
        if ids is not None:
            return list(ids)
        out: list[Unit] = []
        for msg in body["messages"] if isinstance(body["messages"], list) else []:
            if isinstance(msg, dict):
                out += [_MARKER] * TOKENS_PER_CHAT_MESSAGE
                out += _text_units(str(msg.get("role", "")), counter)
                out += _text_units(_content_text(msg.get("content")), counter)
        return out
    return _completion_units(body.get("prompt"), counter)


def _completion_units(prompt: Any, counter: TextCounter) -> list[Unit]:
    if isinstance(prompt, str):
        return _text_units(prompt, counter)
    if isinstance(prompt, list):
        if all(isinstance(t, int) for t in prompt):
            return list(prompt)
        return [u for p in prompt for u in _completion_units(p, counter)]
    return []


def block_hashes(units: Sequence[Unit], block_size: int) -> tuple[bytes, ...]:
    """The chained hash of every full block of tokens (a partial last block has none, as in vLLM).

    A prompt of token ids only, or of text pieces only (the usual prompts), is laid out as one bytes
    or str object in C and each block is a slice of it: a 30K-token prompt hashes in ~2 ms instead of
    ~8-18 ms of per-unit Python, the time its intake thread holds the GIL the serving loop needs (a
    decode instance hashes the prompts it pulls too). The hashes name blocks within one instance only.
    """
    full = len(units) // block_size * block_size
    if not full:
        return ()
    kinds = set(map(type, units[:full]))
    if kinds == {int}:
        try:
            ids = array("q", cast("Sequence[int]", units[:full])).tobytes()
            return _chain(_ID_TAG, memoryview(ids), 8 * block_size)
        except OverflowError:  # an id past 64 bits: the per-unit layout below names it
            pass
    elif kinds == {str}:
        return _piece_hashes(cast("Sequence[str]", units[:full]), block_size)
    return _chain_blocks(
        _block_text(units[start : start + block_size]).encode("utf-8", "surrogatepass")
        for start in range(0, full, block_size)
    )


# A chain's seed says its layout: int64 ids, text pieces joined by \x1f, or none for the per-unit tags of
# `_block_text` (whose text starts with a type's initial letter), so no two layouts name the same block.
_ID_TAG = b"\x01"
_PIECE_TAG = b"\x02"


def _chain(tag: bytes, data: bytes | memoryview, width: int) -> tuple[bytes, ...]:
    """Chained hashes of data's consecutive `width`-byte slices (its length is a multiple of width)."""
    return _chain_blocks((data[start : start + width] for start in range(0, len(data), width)), tag)


def _chain_blocks(blocks: Iterable[bytes | memoryview], tag: bytes = b"") -> tuple[bytes, ...]:
    """Each block hashed with the one before it; the first with the layout's tag (the chain's seed)."""
    out: list[bytes] = []
    parent = tag
    blake2b = hashlib.blake2b
    for block in blocks:
        parent = blake2b(parent + block, digest_size=16).digest()
        out.append(parent)
    return tuple(out)


def _piece_hashes(pieces: Sequence[str], block_size: int) -> tuple[bytes, ...]:
    """Text pieces joined by \x1f in one string; block i is the slice between its pieces' offsets."""
    whole = "\x1f".join(pieces)
    ends = list(accumulate(map(len, pieces)))
    # block i spans pieces [i*bs, (i+1)*bs): from the end of the piece before it plus its separator
    starts = [0, *(ends[i - 1] + i for i in range(block_size, len(pieces), block_size))]
    stops = [ends[i - 1] + i - 1 for i in range(block_size, len(pieces) + 1, block_size)]
    if whole.isascii():  # one encode, byte offsets are character offsets
        data = memoryview(whole.encode("ascii"))
        return _chain_blocks((data[a:b] for a, b in zip(starts, stops, strict=True)), _PIECE_TAG)
    return _chain_blocks(
        (whole[a:b].encode("utf-8", "surrogatepass") for a, b in zip(starts, stops, strict=True)), _PIECE_TAG
    )


def _block_text(block: Sequence[Unit]) -> str:
    """A block of mixed units as one string: each tagged with its type's initial, `\x1f` between them
    (a chat prompt's role markers among a tokenizer's ids)."""
    return "\x1f".join(f"{type(u).__name__[0]}{u}" for u in block)


class BlockPool:
    """Free and used KV blocks, reference counts, and the hash → block map of cached full blocks."""

    def __init__(self, num_blocks: int, caching: bool) -> None:
        self.num_blocks = num_blocks
        self.caching = caching
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._refs = [0] * num_blocks
        self._hash_of: dict[int, bytes] = {}
        self._block_of: dict[bytes, int] = {}
        # the KV events publisher's, when on: ("stored", hashes, parent) and ("removed", [hash], None)
        self.events: list[tuple[str, list[bytes], bytes | None]] | None = None

    @property
    def num_free(self) -> int:
        """Blocks no request uses (cached ones included: they are reusable, as vLLM counts them)."""
        return len(self._free)

    @property
    def num_cached(self) -> int:
        """Blocks that carry a prefix hash (used or free)."""
        return len(self._block_of)

    def take(self, n: int) -> list[int] | None:
        """n blocks off the head of the free queue (their hashes evicted); None (nothing taken) if short."""
        if n > len(self._free):
            return None
        if not self._hash_of:  # nothing cached (always so without prefix caching): no hash to evict
            pop = self._free.popitem
            out = [pop(last=False)[0] for _ in range(n)]
            refs = self._refs
            for block in out:
                refs[block] = 1
            return out
        out = []
        for _ in range(n):
            block, _ = self._free.popitem(last=False)
            old = self._hash_of.pop(block, None)
            if old is not None:
                del self._block_of[old]
                if self.events is not None:
                    self.events.append(("removed", [old], None))
            self._refs[block] = 1
            out.append(block)
        return out

    def free(self, blocks: Sequence[int]) -> None:
        """A request lets go of its blocks: those nobody else uses go to the free queue, tail first."""
        refs, free = self._refs, self._free
        for block in reversed(blocks):
            refs[block] -= 1
            if refs[block] == 0:
                free[block] = None

    def match(self, hashes: Sequence[bytes], max_blocks: int) -> list[int]:
        """The longest run of cached blocks a prompt starts with (at most max_blocks), now in use by it."""
        found = []
        for h in hashes[: max(0, max_blocks)] if self.caching else ():
            block = self._block_of.get(h)
            if block is None:
                break
            found.append(block)
        for block in found:
            if self._refs[block] == 0:
                del self._free[block]
            self._refs[block] += 1
        return found

    def cache(self, blocks: Sequence[int], hashes: Sequence[bytes], full_blocks: int) -> None:
        """Name a request's first full_blocks blocks by their hashes (a cached hash keeps its block)."""
        if not self.caching:
            return
        events = self.events
        run: tuple[str, list[bytes], bytes | None] | None = None
        for i, (block, h) in enumerate(zip(blocks[:full_blocks], hashes[:full_blocks], strict=False)):
            if h not in self._block_of and block not in self._hash_of:
                self._block_of[h] = block
                self._hash_of[block] = h
                if events is not None:  # vLLM's BlockStored: a run of new blocks under its parent
                    if run is None:
                        run = ("stored", [], hashes[i - 1] if i else None)
                        events.append(run)
                    run[1].append(h)
            else:
                run = None

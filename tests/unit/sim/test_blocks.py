"""The KV block pool and its prefix cache: chained block hashes, prompts laid out as the tokens
pdfleet.tokens counts, vLLM's free queue (least recently freed first, a request's tail first)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdfleet.chat_template import load_chat_template
from pdfleet.sim.blocks import _MARKER, BlockPool, OnceCounter, block_hashes, once, prompt_units
from pdfleet.tokens import CharEstimate, HFTokenizer, count_request_tokens
from tests.unit.sim.helpers import chat_model_dir, make_tokenizer, words_text


def test_a_block_hash_chains_over_every_block_before_it() -> None:
    a = block_hashes(list(range(40)), 16)
    b = block_hashes([*range(16), 99, *range(17, 40)], 16)
    assert len(a) == 2  # the partial third block has no hash, as in vLLM
    assert a[0] == b[0] and a[1] != b[1]
    # the same tokens behind a different first block are a different block
    c = block_hashes([7, *range(1, 32)], 16)
    assert c[1] != a[1]
    assert block_hashes(list(range(32)), 16)[:2] == a[:2]


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [{"role": "system", "content": "x" * 101}, {"role": "user", "content": "hi there"}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "abc" * 50}]}]},
        {"prompt": "y" * 333},
        {"prompt": ["ab" * 40, "cd" * 7]},
        {"prompt": [1, 2, 3, 4, 5]},
    ],
)
def test_a_prompt_is_as_many_tokens_as_pdfleet_tokens_counts(body: dict[str, object]) -> None:
    counter = CharEstimate(3.5)
    assert len(prompt_units(body, counter)) == count_request_tokens(body, counter)


def test_with_a_tokenizer_the_tokens_are_its_ids(tmp_path: Path) -> None:
    tok = HFTokenizer(make_tokenizer(tmp_path / "tokenizer.json"))
    body = {"prompt": words_text(200, seed=3)}
    units = prompt_units(body, tok)
    assert units == tok.encode(str(body["prompt"])) and len(units) == count_request_tokens(body, tok)


def test_chat_prompts_sharing_a_system_prompt_share_its_blocks() -> None:
    counter = CharEstimate()
    system = {"role": "system", "content": words_text(400, seed=1)}
    head = len(prompt_units({"messages": [system]}, counter))
    one = prompt_units({"messages": [system, {"role": "user", "content": "a" * 400}]}, counter)
    two = prompt_units({"messages": [system, {"role": "user", "content": "b" * 400}]}, counter)
    h1, h2 = block_hashes(one, 16), block_hashes(two, 16)
    assert len(h1) == len(h2) > head // 16
    assert h1[: head // 16] == h2[: head // 16]  # every block within the system turn is shared
    assert h1[head // 16 + 1 :] and not set(h1[head // 16 + 1 :]) & set(h2)  # none after the turns differ


def test_freed_blocks_stay_cached_until_the_queue_hands_them_out_again() -> None:
    pool = BlockPool(4, caching=True)
    hashes = block_hashes(list(range(48)), 16)
    blocks = pool.take(3)
    assert blocks == [0, 1, 2]
    pool.cache(blocks, hashes, 3)
    pool.free(blocks)
    assert pool.num_free == 4 and pool.num_cached == 3
    assert pool.match(hashes, 3) == [0, 1, 2] and pool.num_free == 1
    pool.free([0, 1, 2])
    # the free queue is [3, 2, 1, 0]: block 3 (never cached), then the request's tail first
    assert pool.take(2) == [3, 2] and pool.num_cached == 2
    assert pool.match(hashes, 3) == [0, 1]  # the chain stops at the evicted block


def test_a_shared_block_is_free_only_when_its_last_user_lets_go() -> None:
    pool = BlockPool(2, caching=True)
    hashes = block_hashes(list(range(16)), 16)
    first = pool.take(1)
    assert first is not None
    pool.cache(first, hashes, 1)
    assert pool.match(hashes, 1) == first and pool.num_free == 1
    pool.free(first)
    assert pool.num_free == 1  # still used by the second request
    pool.free(first)
    assert pool.num_free == 2 and pool.take(3) is None and pool.num_free == 2


def test_without_caching_nothing_matches() -> None:
    pool = BlockPool(2, caching=False)
    hashes = block_hashes(list(range(16)), 16)
    blocks = pool.take(1)
    assert blocks is not None
    pool.cache(blocks, hashes, 1)
    pool.free(blocks)
    assert pool.match(hashes, 1) == [] and pool.num_cached == 0


def _old_pieces(text: str, n: int) -> list[str]:
    import math

    step = len(text) / n
    return [text[math.floor(i * step) : math.floor((i + 1) * step)] for i in range(n)]


def _changed(unit: int | str) -> int | str:
    return unit + 1 if isinstance(unit, int) else unit + "x"


@pytest.mark.parametrize(
    "units",
    [
        list(prompt_units({"prompt": "ab" * 60 + "é"}, CharEstimate())),  # pieces, one not ASCII
        list(prompt_units({"prompt": "wxyz" * 15}, CharEstimate())),  # ASCII pieces
        list(range(100, 155)),  # token ids
        [2**70, *range(60)],  # an id past 64 bits
        ["\0role-marker", 5, "x", 7, *range(60)],  # a chat prompt's markers among ids
        [True, *range(60)],
    ],
)
def test_a_block_is_named_by_every_unit_up_to_its_end_and_none_after(units: list[int | str]) -> None:
    """Each layout (ids, pieces, mixed) slices its blocks right: changing any one unit changes the hash
    of its block and of every block after it, and of none before it."""
    hashes = block_hashes(units, 16)
    assert len(hashes) == len(units) // 16 and len(set(hashes)) == len(hashes)
    for k in range(len(hashes)):
        assert block_hashes(units[: 16 * k + 16], 16) == hashes[: k + 1]
    for j, unit in enumerate(units[: 16 * len(hashes)]):
        other = block_hashes([*units[:j], _changed(unit), *units[j + 1 :]], 16)
        k = j // 16
        assert other[:k] == hashes[:k] and all(a != b for a, b in zip(other[k:], hashes[k:], strict=True))


def test_an_id_a_text_piece_and_a_bool_name_different_blocks() -> None:
    assert len({block_hashes(block, 16)[0] for block in ([1] * 16, ["1"] * 16, [True] * 16)}) == 3


def test_the_pieces_are_the_ones_first_written() -> None:
    for text in ("x" * 4000, "x" * 4001, "ab" * 777):
        n = CharEstimate().count(text)
        assert prompt_units({"prompt": text}, CharEstimate()) == _old_pieces(text, n)


def test_a_request_is_tokenized_once_for_its_count_and_its_blocks(tmp_path: Path) -> None:
    tok = HFTokenizer(make_tokenizer(tmp_path / "tokenizer.json"))
    counter = once(tok)
    assert isinstance(counter, OnceCounter) and once(CharEstimate()).count("abcd") == 1
    calls: list[str] = []
    real = tok.encode

    def counted(text: str) -> list[int]:
        calls.append(text)
        return real(text)

    tok.encode = counted  # type: ignore[method-assign]
    body = {"messages": [{"role": "user", "content": words_text(300, 7)}]}
    n = count_request_tokens(body, counter)
    units = prompt_units(body, counter)
    assert len(units) == n == count_request_tokens(body, HFTokenizer(make_tokenizer(tmp_path / "t2.json")))
    assert sorted(calls) == sorted(set(calls))  # each text (role, content) encoded once


def test_with_events_on_the_pool_reports_each_run_it_names_and_each_hash_it_evicts() -> None:
    """What the KV events publisher reads (vLLM's BlockStored/BlockRemoved): a run of newly named
    blocks under its parent's hash (a block already named splits runs), an evicted hash when a cached
    free block is handed out again; with events off nothing is kept."""
    pool = BlockPool(4, caching=True)
    pool.events = []
    h = [bytes([i]) * 16 for i in range(5)]
    blocks = pool.take(3)
    assert blocks is not None
    pool.cache(blocks, h[:3], 2)  # the first two blocks computed
    pool.cache(blocks, h[:3], 3)  # the third: a run of one under the second
    assert pool.events == [("stored", [h[0], h[1]], None), ("stored", [h[2]], h[1])]
    pool.free(blocks)
    pool.events.clear()
    assert pool.take(4) is not None  # the free queue hands out the cached blocks: their hashes go
    assert sorted(hs[0] for kind, hs, _ in pool.events if kind == "removed") == sorted(h[:3])
    quiet = BlockPool(4, caching=True)
    got = quiet.take(1)
    assert got is not None
    quiet.cache(got, h[:1], 1)
    assert quiet.events is None


def test_with_a_chat_template_a_chat_prompt_is_its_rendered_ids_counted_and_rendered_once(
    tmp_path: Path,
) -> None:
    """The model's chat template rendered and tokenized as vLLM does: the prompt's units are those ids
    (what KV events carry), its count their number, the render and the encode done once a request."""
    model = chat_model_dir(tmp_path)
    template = load_chat_template(str(model))
    tok = HFTokenizer(model / "tokenizer.json", template)
    body = {
        "messages": [{"role": "system", "content": " the quick"}, {"role": "user", "content": " brown fox"}]
    }
    ids = tok.encode("<s><|system|>\n the quick</s><|user|>\n brown fox</s><|assistant|>\n")
    counter = once(tok)
    renders: list[object] = []
    real = tok.chat_ids

    def counted(b: dict[str, object]) -> list[int] | None:
        renders.append(b)
        return real(b)

    tok.chat_ids = counted  # type: ignore[method-assign]
    assert count_request_tokens(body, counter) == len(ids) and prompt_units(body, counter) == ids
    assert len(renders) == 1
    image = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}
    assert prompt_units(image, once(tok)) == [_MARKER] * 3 + tok.encode("user")  # not rendered: as before

"""The approximate prefix index: chained block hashes, the cached prefix found by bisection, the LRU bound
(earlier blocks forgotten last), and the prompt text of each endpoint."""

from __future__ import annotations

from pdfleet.gateway.prefix_index import PrefixIndex, prompt_blocks, prompt_text

BLOCK = 16
CPT = 4.0  # characters per token: a block is 64 characters


def _text(n_blocks: int, seed: str = "a") -> str:
    return "".join(f"{seed}{i:063d}" for i in range(n_blocks))


def test_blocks_are_whole_and_chained() -> None:
    text = _text(10)
    blocks = prompt_blocks(text + "tail", BLOCK, CPT)
    assert len(blocks) == 10  # the partial tail is no block
    other = prompt_blocks("X" + text[1:], BLOCK, CPT)
    assert set(blocks).isdisjoint(other)  # one changed first character changes every later block
    assert prompt_blocks(text[:320], BLOCK, CPT) == blocks[:5]
    assert len(prompt_blocks(list(range(100)), BLOCK, CPT)) == 6  # token ids: 16 a block


def test_cached_tokens_is_the_longest_recorded_prefix() -> None:
    index = PrefixIndex(capacity=1000, block_tokens=BLOCK)
    turn1 = prompt_blocks(_text(20), BLOCK, CPT)
    assert index.cached_tokens("a", turn1, 320) == 0
    index.record("a", turn1)
    turn2 = prompt_blocks(_text(20) + _text(5, "b"), BLOCK, CPT)
    assert index.cached_tokens("a", turn2, 400) == 20 * BLOCK
    assert index.cached_tokens("b", turn2, 400) == 0  # another candidate
    assert index.cached_tokens("a", turn1, 100) == 100  # never more than the prompt


def test_the_bound_forgets_least_recent_blocks_and_keeps_prefixes_whole() -> None:
    index = PrefixIndex(capacity=30, block_tokens=BLOCK)
    first = prompt_blocks(_text(20), BLOCK, CPT)
    second = prompt_blocks(_text(20, "z"), BLOCK, CPT)
    index.record("a", first)
    index.record("a", second)
    assert index.size("a") == 30
    # the first prompt's last 10 blocks went first; its first 10 remain and are found
    assert index.cached_tokens("a", first, 320) == 10 * BLOCK
    assert index.cached_tokens("a", second, 320) == 20 * BLOCK


def test_prompt_text_follows_what_the_engine_prefills() -> None:
    chat = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]}
    longer = {"messages": [*chat["messages"], {"role": "assistant", "content": "A"}]}
    a, b = prompt_text(chat, "chat"), prompt_text(longer, "chat")
    assert isinstance(a, str) and isinstance(b, str) and b.startswith(a)
    assert prompt_text({"prompt": "hello"}, "completions") == "hello"
    assert prompt_text({"prompt": [1, 2, 3]}, "completions") == [1, 2, 3]
    messages = {"system": "S", "messages": [{"role": "user", "content": [{"type": "text", "text": "U"}]}]}
    assert prompt_text(messages, "messages") == a  # Anthropic's body becomes the same chat

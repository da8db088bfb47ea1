"""Synthetic prompts count as the intended tokens; completion bodies ask for what the benches need."""

from __future__ import annotations

import json

from pdfleet.bench.workload import SIM_MODEL, completion_body, synthetic_prompt
from pdfleet.tokens import make_counter


def test_a_synthetic_prompt_counts_as_its_tokens() -> None:
    """The simulator's and the gateway's estimate (no tokenizer) counts exactly `tokens`."""
    counter = make_counter(None)
    for tokens in (1, 128, 1024, 30000):
        assert counter.count(synthetic_prompt(tokens)) == tokens
    assert set(synthetic_prompt(3, "b")) == {"b"}


def test_a_streaming_body_ignores_eos() -> None:
    """Streaming, exactly max_tokens long, for the simulator's model unless told otherwise."""
    body = json.loads(completion_body("xxxx", 256))
    assert body == {
        "model": SIM_MODEL,
        "prompt": "xxxx",
        "max_tokens": 256,
        "ignore_eos": True,
        "stream": True,
    }


def test_a_plain_body_leaves_the_flags_out() -> None:
    """stream=False, ignore_eos=False: the keys are absent (the server's defaults)."""
    body = json.loads(completion_body("x", 4, model="m", stream=False, ignore_eos=False))
    assert body == {"model": "m", "prompt": "x", "max_tokens": 4}

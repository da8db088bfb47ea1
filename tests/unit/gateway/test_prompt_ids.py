"""A route's `tokenizer:` directory: loaded with the policy (relative to it), refused with the file and
key when it cannot render a chat prompt; the engine's ids of a chat request, off the event loop, and
the text path for what is not rendered here."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pdfleet.gateway.prefix_index import prompt_blocks
from pdfleet.gateway.prompt_ids import EnginePrompt, engine_ids, prompt_ids
from tests.unit.gateway.helpers import COLO, DIS, load_test_policy, policy_dict, policy_error
from tests.unit.sim.helpers import chat_model_dir


def test_a_route_s_tokenizer_directory_is_loaded_relative_to_the_policy(tmp_path: Path) -> None:
    chat_model_dir(tmp_path / "model")
    policy = load_test_policy(tmp_path, models={"llama": {"colocated": COLO, "tokenizer": "model"}})
    tok = policy.routes["llama"].tokenizer
    assert tok is not None
    body = {"messages": [{"role": "user", "content": " the quick"}]}
    assert engine_ids(tok, body) == tok.encode("<s><|user|>\n the quick</s><|assistant|>\n")
    assert load_test_policy(tmp_path).routes["llama"].tokenizer is None


def test_a_directory_that_cannot_render_a_chat_prompt_is_refused_with_its_key(tmp_path: Path) -> None:
    chat_model_dir(tmp_path / "bare", template=None)
    (tmp_path / "empty").mkdir()
    for directory, why in (("empty", "holds no tokenizer.json"), ("bare", "has no chat template")):
        pol = policy_dict(COLO, DIS, models={"llama": {"colocated": COLO, "tokenizer": directory}})
        message = policy_error(tmp_path, pol)
        assert "models.llama.tokenizer" in message and why in message, message


def test_only_chat_requests_it_renders_get_ids(tmp_path: Path) -> None:
    chat_model_dir(tmp_path / "model")
    tok = (
        load_test_policy(tmp_path, models={"llama": {"colocated": COLO, "tokenizer": "model"}})
        .routes["llama"]
        .tokenizer
    )
    chat = {"messages": [{"role": "user", "content": "x"}]}
    image = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]}

    async def ids() -> list[object]:
        return [
            await prompt_ids(tok, chat, "chat", 4),
            await prompt_ids(tok, {"prompt": "x"}, "completions", 4),
            await prompt_ids(tok, chat, "messages", 4),
            await prompt_ids(None, chat, "chat", 4),
            await prompt_ids(tok, image, "chat", 4),
        ]

    got = asyncio.run(ids())
    assert tok is not None and got[1:] == [None, None, None, None]
    ids_of_chat = engine_ids(tok, chat) or []  # counted, and cut into whole blocks of 4 as the decider's
    assert got[0] == EnginePrompt(len(ids_of_chat), prompt_blocks(ids_of_chat, 4, 1.0))
    first = got[0]
    assert isinstance(first, EnginePrompt) and len(ids_of_chat) // 4 == len(first.blocks) > 1

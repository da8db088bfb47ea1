"""The lab's model repository: a config and a tokenizer the simulator really loads, the same bytes
everywhere."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer

from pdfleet.chat_template import load_chat_template
from pdfleet.lab.model_mirror import CHAT_TOKENS, LAB_WORDS, lab_model_files
from pdfleet.sim.stream import DEFAULT_FILLER
from pdfleet.sim.vocab import choose_filler
from pdfleet.tokens import HFTokenizer, chat_ids


def test_the_lab_tokenizer_loads_and_spells_the_filler_words_as_one_token_each() -> None:
    files = lab_model_files("lab-r1")
    tok = Tokenizer.from_str(files["tokenizer.json"].decode())
    config = json.loads(files["config.json"])
    assert tok.get_vocab_size() == config["vocab_size"] == 346
    for word in LAB_WORDS:
        assert len(tok.encode(word, add_special_tokens=False).ids) == 1, word
    text = " the quick brown fox, héllo wörld"
    assert tok.decode(tok.encode(text).ids) == text  # byte-level: any text, round trip
    assert set(choose_filler(tok).words) == set(DEFAULT_FILLER.words)  # streamed text re-tokenizes exactly
    generation = json.loads(files["generation_config.json"])
    assert [tok.id_to_token(generation[k]) for k in ("bos_token_id", "eos_token_id")] == ["<s>", "</s>"]


def test_the_files_depend_on_the_revision_only() -> None:
    assert lab_model_files("lab-r1") == lab_model_files("lab-r1")
    r1, r2 = lab_model_files("lab-r1"), lab_model_files("lab-r2")
    assert r1["tokenizer.json"] == r2["tokenizer.json"] and r1["config.json"] != r2["config.json"]


def test_the_lab_model_renders_a_chat_request_with_llama_3_s_template(tmp_path: Path) -> None:
    """Meta-Llama-3-8B-Instruct's template in tokenizer_config.json: vLLM's rendering of a chat request
    (pdfleet.chat_template), its header and turn-end tokens one special id each."""
    for name, data in lab_model_files("lab-r1").items():
        (tmp_path / name).write_bytes(data)
    template = load_chat_template(str(tmp_path))
    assert template is not None
    body = {"messages": [{"role": "system", "content": " be brief "}, {"role": "user", "content": "the fox"}]}
    text = template.render(body)
    assert text == (
        "<s><|start_header_id|>system<|end_header_id|>\n\nbe brief<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nthe fox<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    tok = HFTokenizer(tmp_path / "tokenizer.json", template)
    ids = chat_ids(body, tok)
    specials = {tok.encode(t)[0] for t in ("<s>", *CHAT_TOKENS)}
    # the BOS, three headers' two tokens each, two turn ends
    assert len(specials) == 4 and sum(i in specials for i in ids) == 1 + 3 * 2 + 2

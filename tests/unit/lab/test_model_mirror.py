"""The lab's model repository: a config and a tokenizer the simulator really loads, the same bytes
everywhere."""

from __future__ import annotations

import json

from tokenizers import Tokenizer

from pdfleet.lab.model_mirror import LAB_WORDS, lab_model_files
from pdfleet.sim.stream import DEFAULT_FILLER
from pdfleet.sim.vocab import choose_filler


def test_the_lab_tokenizer_loads_and_spells_the_filler_words_as_one_token_each() -> None:
    files = lab_model_files("lab-r1")
    tok = Tokenizer.from_str(files["tokenizer.json"].decode())
    config = json.loads(files["config.json"])
    assert tok.get_vocab_size() == config["vocab_size"] == 343
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

"""A local model directory as the simulator reads it (a staged model): config.json's derived length as
vLLM 0.11 derives it, the tokenizer's files, and a clear refusal naming a missing or broken file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdfleet.errors import ValidationError
from pdfleet.lab.model_mirror import lab_model_files
from pdfleet.sim.config import parse_serve_args
from pdfleet.sim.model_dir import derived_max_len, describe_dir, read_model_dir
from tests.unit.sim.helpers import MODEL


def _staged(tmp_path: Path, revision: str = "lab-r1") -> Path:
    """The lab model's files in a directory named like a staged revision's (its last part names no model)."""
    directory = tmp_path / revision
    directory.mkdir()
    for path, data in lab_model_files(revision).items():
        (directory / path).write_bytes(data)
    return directory


def _edit_config(directory: Path, **changes: object) -> None:
    config = json.loads((directory / "config.json").read_text())
    config.update(changes)
    (directory / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    ("config", "tokenizer_config", "want"),
    [
        ({"max_position_embeddings": 4096, "seq_length": 2048}, None, (2048, "seq_length")),
        ({"max_position_embeddings": 8192, "model_max_length": 131072}, None, (131072, "model_max_length")),
        ({"n_positions": 1024}, {"model_max_length": 512}, (512, "tokenizer_config.json model_max_length")),
        ({"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}, None,
         (8192, "max_position_embeddings")),
        ({"max_position_embeddings": 32768,
          "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192}},
         None, (32768, "max_position_embeddings")),
        ({"max_position_embeddings": 131072, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, None,
         (131072, "max_position_embeddings")),
        ({"hidden_size": 64}, None, (2048, "default")),
    ],
)  # fmt: skip
def test_the_derived_length_is_vllms(
    config: dict[str, object], tokenizer_config: dict[str, object] | None, want: tuple[int, str]
) -> None:
    assert derived_max_len(config, tokenizer_config) == want


def test_the_lab_model_is_read_config_and_tokenizer(tmp_path: Path) -> None:
    directory = _staged(tmp_path)
    md = read_model_dir(str(directory))
    assert md.architectures == ("LlamaForCausalLM",)
    assert (md.max_len, md.max_len_key) == (131072, "max_position_embeddings")
    assert md.tokenizer_file == str(directory / "tokenizer.json")
    # 256 bytes, the filler words' merges, <s>, </s> and Llama 3's three chat tokens
    assert md.tokenizer_kind == "BPE, 346 tokens"
    ran = describe_dir(md, tokenizer_runs=True)
    assert ran == (
        f"pdfleet-sim: model config {directory}/config.json (LlamaForCausalLM, max_position_embeddings: "
        f"max_model_len 131072); tokenizer {directory}/tokenizer.json (BPE, 346 tokens) counts prompt tokens"
    )
    read_only = describe_dir(md, tokenizer_runs=False)
    assert read_only.endswith(
        "(the tokenizers package, pdfleet[tokenizer], is not installed): prompt tokens are estimated"
    )
    (directory / "tokenizer.json").unlink()
    assert describe_dir(read_model_dir(str(directory)), True).endswith(
        "; no tokenizer.json there: prompt tokens are estimated"
    )


@pytest.mark.parametrize(
    ("name", "content", "error"),
    [
        (
            "config.json",
            None,
            "config.json: missing (the model's config: vLLM needs it in a local model directory)",
        ),
        ("config.json", b"{not json", "config.json: not JSON (the model's config"),
        ("config.json", b"[1, 2]", "config.json: not a JSON object"),
        ("config.json", b"\xff\xfe", "config.json: cannot read it"),
        ("tokenizer.json", b'{"version": "1.0"}', "tokenizer.json: not a tokenizer.json (no model.vocab)"),
        ("tokenizer_config.json", b"{", "tokenizer_config.json: not JSON (the tokenizer's config)"),
    ],
)
def test_a_missing_or_broken_file_is_refused_naming_it(
    tmp_path: Path, name: str, content: bytes | None, error: str
) -> None:
    directory = _staged(tmp_path)
    if content is None:
        (directory / name).unlink()
    else:
        (directory / name).write_bytes(content)
    with pytest.raises(ValidationError) as err:
        parse_serve_args([str(directory), "--served-model-name", MODEL], env={})
    assert str(err.value).startswith(f"{directory}/{error}"), err.value


def test_the_simulator_serves_a_directory_with_its_configs_length(tmp_path: Path) -> None:
    directory = _staged(tmp_path)
    _edit_config(directory, max_position_embeddings=16384)
    cfg = parse_serve_args([str(directory), "--served-model-name", MODEL, "alias"], env={})
    assert cfg.model == str(directory) and cfg.served_model_names == (MODEL, "alias")
    assert cfg.model_spec.name == "Llama-3.1-8B"  # the catalog's shape, by the first served name it knows
    assert cfg.max_model_len == 16384  # the config's, not the catalog's 131072
    assert cfg.tokenizer == str(directory / "tokenizer.json")  # vLLM's default: the model's directory
    with pytest.raises(ValidationError) as err:
        parse_serve_args([str(directory), "--served-model-name", MODEL, "--max-model-len", "32k"], env={})
    assert str(err.value) == (
        "User-specified max_model_len (32000) is greater than the derived max_model_len "
        f"(max_position_embeddings=16384 in {directory}/config.json)"
    )
    given = parse_serve_args([str(directory), "--served-model-name", MODEL, "--tokenizer", "/x.json"], env={})
    assert given.tokenizer == "/x.json"  # an explicit --tokenizer wins, as in vLLM


def test_a_directory_no_served_name_of_which_the_catalog_knows_is_refused(tmp_path: Path) -> None:
    directory = _staged(tmp_path)
    with pytest.raises(ValidationError, match="not in the simulator's catalog"):
        parse_serve_args([str(directory), "--served-model-name", "my-model"], env={})

"""Model weights in the profile (issue 31): a pinned revision, where the weights are staged from, the hub
token's source and a bandwidth limit; each bad value refused naming the file and key; a floating
revision warned about; one model id served at one revision."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdfleet.model.profile import Profile, ProfileError
from pdfleet.model.profile_loader import load_profile
from pdfleet.model.survey import survey_profiles
from pdfleet.model.weights_checks import weights_warnings
from tests.unit.model.helpers import GOOD

PIN = "0e9e39f249a16976918f6564b8830bc894c89659"  # a hub commit hash's shape


def _load(tmp_path: Path, text: str) -> Profile:
    (tmp_path / "_good.yml").write_text(GOOD)
    (tmp_path / "w.yml").write_text("extends: _good\n" + text)
    return load_profile("w", tmp_path)


def _refused(tmp_path: Path, text: str) -> str:
    with pytest.raises(ProfileError) as err:
        _load(tmp_path, text)
    return str(err.value)


@pytest.mark.parametrize(
    ("source", "token"),
    [
        ("hub", "{env: HF_TOKEN}"),
        ("hub", "{file: ~/.config/pdfleet/hf-token}"),
        ("http://198.18.0.1:8083/models/", "null"),
        ("/srv/models", "null"),
    ],
)
def test_a_staged_model_names_source_revision_token_and_limit(
    tmp_path: Path, source: str, token: str
) -> None:
    profile = _load(
        tmp_path, f"model: {{source: '{source}', revision: {PIN}, token: {token}, bandwidth_limit: 50M}}\n"
    )
    model = profile.model
    assert model.staged and model.source == source and model.revision == PIN
    assert model.bandwidth_limit == "50M"
    assert (model.token is not None) == (source == "hub")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("model: {source: 'http://m/'}", "model.revision: source 'http://m/' stages a pinned revision"),
        ("model: {source: models/here, revision: r1}", "model.source: must be 'hub', an http:// or https://"),
        ("model: {source: 'http://m/', revision: r1, token: {env: T}}", "model.token: only source 'hub'"),
        ("model: {source: hub, revision: r1, token: {}}", "model.token: set exactly one of file"),
        ("model: {source: hub, revision: r1, token: {env: 'A B'}}", "model.token.env: "),
        (
            "model: {source: hub, revision: 'refs/pr/1'}",
            "model.revision: a staged revision names a directory",
        ),
        ("model: {source: hub, revision: r1, bandwidth_limit: fast}", "model.bandwidth_limit: "),
        ("model: {bandwidth_limit: 10M}", "model.bandwidth_limit: applies to staged weights only"),
        ("model: {source: hub, revision: r1, path: /data/llama}", "model.path: is where vLLM reads"),
        (
            "model: {source: 'http://m/', revision: r1, hub_endpoint: 'http://h/'}",
            "model.hub_endpoint: is the hub's",
        ),
        ("model: {source: hub, revision: r1, hub_endpoint: h.example}", "model.hub_endpoint: is the hub's"),
    ],
)
def test_bad_weights_settings_are_refused_naming_file_and_key(
    tmp_path: Path, text: str, expected: str
) -> None:
    message = _refused(tmp_path, text + "\n")
    assert f"{tmp_path / 'w.yml'}: {expected}" in message, message


def test_a_decode_pool_loading_its_weights_differently_is_refused(tmp_path: Path) -> None:
    message = _refused(tmp_path, "pools: {decode: {extra_args: [--tokenizer-revision, other]}}\n")
    assert (
        "pools.decode.extra_args: --tokenizer-revision is ['other'] on decode but unset on prefill" in message
    )
    same = "pools: {prefill: {extra_args: ['--dtype=half']}, decode: {extra_args: [--dtype, half]}}\n"
    assert _load(tmp_path, same) is not None  # the same option on both pools, spelled either way
    # the revision itself is the model's one key: no pool can set its own
    message = _refused(tmp_path, f"pools: {{decode: {{extra_args: [--revision, {PIN}]}}}}\n")
    assert "pools.decode.extra_args[0]: --revision is rendered by pdfleet from model.revision" in message


def test_one_model_id_is_served_at_one_revision(tmp_path: Path) -> None:
    two = (
        "gateway: {model_alias: null}\nmodels:\n"
        f"  - {{name: a, aliases: [a], model: {{id: org/m, revision: {PIN}, source: hub}}}}\n"
        "  - name: b\n    aliases: [b]\n    model: {id: org/m, revision: other, source: hub}\n"
        "    topology: colocated\n    pools: {prefill: null, decode: null, colocated: "
        "{port: 8001, gpus: [1], max_num_batched_tokens: 4096, gpu_memory_utilization: 0.9}}\n"
    )
    message = _refused(tmp_path, two)
    assert (
        f"models[1].model.revision: org/m is served at revision '{PIN}' by models[0].model but 'other'"
        in message
    )


def test_a_floating_vllm_revision_is_warned_about_not_refused(tmp_path: Path) -> None:
    profile = _load(tmp_path, "")
    warnings = weights_warnings(profile)
    assert [w.path for w in warnings] == ["model.revision"]
    assert "floats on the hub's default branch" in warnings[0].message
    assert weights_warnings(_load(tmp_path, f"model: {{revision: {PIN}}}\n")) == []
    assert weights_warnings(_load(tmp_path, "vllm: {engine: sim}\n")) == []
    _load(tmp_path, "")
    (status,) = survey_profiles(tmp_path, names=["w"])
    assert status.ok and [w for w in status.warnings if "gateway.tls" not in w] == [
        f"{tmp_path / '_good.yml'}: model.revision: {warnings[0].message}",
    ]

"""The gateway's copy of the staged revision's tokenizer (gateway.decider.tokenizer: staged, issue 32): its
files from the revision's manifest on the gateway host, the route naming that directory (the gateway's own
policy check loads it and renders a chat request), the tokenizer extra in the gateway's venv and in the
simulators' serving that model; and a bad setting refused naming its key."""

from __future__ import annotations

import functools
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

import roles.gateway as gateway_role
from pdfleet.errors import PdfleetError
from pdfleet.fleet.deployment import Deployment, DeploymentRequest, load_deployment
from pdfleet.fleet.host_wheel import TOKENIZER_EXTRA, extra_requirements
from pdfleet.fleet.provision import render_fleet
from pdfleet.gateway.policy import parse_policy
from pdfleet.gateway.prompt_ids import load_route_tokenizer
from pdfleet.lab.model_mirror import LAB_MODEL, build_lab_models
from pdfleet.model.specs import ModelSpec
from pdfleet.model.weights import WeightsManifest
from pdfleet.ops.base import FakeFacts
from pdfleet.ops.files import FileContent
from pdfleet.ops.pip import PipRequirements
from pdfleet.ops.weights import StageFile, WeightsSpace
from roles import REGISTRY, vllm
from roles.gateway.tokenizer import TOKENIZER_FILES
from tests.unit.fleet.helpers import TEST_SECRETS, _with_tls
from tests.unit.roles.helpers import REPO

DIR = f"/var/lib/pdfleet/models/{LAB_MODEL}/lab-r1"
PROFILE = "lab-cross-kv-events"


@pytest.fixture(scope="module")
def lab_manifest(tmp_path_factory: pytest.TempPathFactory) -> WeightsManifest:
    return build_lab_models(tmp_path_factory.mktemp("models"))[0]


def _deploy(profile: str, manifest: WeightsManifest, profiles: Path = REPO / "profiles") -> Deployment:
    def manifests(models: Sequence[ModelSpec]) -> Mapping[str, WeightsManifest]:
        return {m.id: manifest for m in models}

    request = DeploymentRequest(
        profile,
        REPO / "inventory/lab.yml",
        profiles,
        REPO / "templates",
        REGISTRY,
        secrets=functools.partial(_with_tls, TEST_SECRETS),
        manifests=manifests,
    )
    return load_deployment(request)


def test_the_gateway_host_gets_the_revision_s_tokenizer_files_and_the_route_names_them(
    lab_manifest: WeightsManifest, tmp_path: Path
) -> None:
    fleet = _deploy(PROFILE, lab_manifest)
    ctx = fleet.context(fleet.inventory.hosts["lab-gw"])
    ops = list(gateway_role.operations(ctx, FakeFacts({FileContent(gateway_role.POLICY_FILE): None})))
    staged = [op for op in ops if isinstance(op, StageFile)]
    assert {op.file.path for op in staged} == {
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    }
    assert {op.directory for op in staged} == {DIR} and {h.name for op in staged for h in op.notify} == {
        "reload pdfleet-gateway.service"
    }
    (space,) = [op for op in ops if isinstance(op, WeightsSpace)]
    assert {f.path for f in space.manifest.files} <= set(TOKENIZER_FILES)  # not the shards: 2 x 2 MiB
    (pip,) = [op for op in ops if isinstance(op, PipRequirements)]
    assert set(extra_requirements(TOKENIZER_EXTRA)) == {"tokenizers>=0.15", "jinja2>=3.1"}
    assert set(extra_requirements(TOKENIZER_EXTRA)) <= set(pip.requirements)
    # the route names the directory, which the gateway's policy loader loads (Llama 3's template)
    rendered = {f.path: f for f in render_fleet(fleet, [fleet.inventory.hosts["lab-gw"]])["lab-gw"]}
    text = rendered[gateway_role.POLICY_FILE].content
    (route,) = parse_policy(Path("policy.yaml"), text).models.values()
    assert route.tokenizer == DIR
    local = tmp_path / DIR.lstrip("/")
    local.mkdir(parents=True)
    models = tmp_path / "mirror"
    build_lab_models(models)
    for name in TOKENIZER_FILES[:3]:
        shutil.copy(models / LAB_MODEL / "lab-r1" / name, local / name)
    tok = load_route_tokenizer(str(local), tmp_path / "policy.yaml", "models.llama-3.1-8b.tokenizer")
    assert tok is not None and tok.template is not None
    assert tok.template.render({"messages": [{"role": "user", "content": "hi"}]}) == (
        "<s><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_simulators_of_a_tokenizing_model_install_the_tokenizer_and_others_do_not(
    lab_manifest: WeightsManifest,
) -> None:
    extra = set(extra_requirements(TOKENIZER_EXTRA))
    for profile, wanted in ((PROFILE, True), ("lab-weights", False)):
        fleet = _deploy(profile, lab_manifest)
        for name in ("lab-colo1", "lab-p1", "lab-d1"):
            reqs = set(vllm.requirements(fleet.context(fleet.inventory.hosts[name])))
            assert (extra <= reqs) == wanted, (profile, name, reqs)
    plain = _deploy("lab-weights", lab_manifest)
    ctx = plain.context(plain.inventory.hosts["lab-gw"])
    ops = list(gateway_role.operations(ctx, FakeFacts({FileContent(gateway_role.POLICY_FILE): None})))
    assert not any(isinstance(op, StageFile) for op in ops)
    (pip,) = [op for op in ops if isinstance(op, PipRequirements)]
    assert not extra & set(pip.requirements)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("model: {source: null}", "gateway.decider.tokenizer: staged: the gateway reads the tokenizer"),
        ("model: {tokenizer: other/tok}", "the engines load model.tokenizer (other/tok)"),
        ("gateway: {decider: {tokenizer: hub}}", "gateway.decider.tokenizer"),
    ],
)
def test_a_bad_tokenizer_setting_names_the_key(
    lab_manifest: WeightsManifest, tmp_path: Path, override: str, expected: str
) -> None:
    profiles = tmp_path / "profiles"
    shutil.copytree(REPO / "profiles", profiles)
    (profiles / "tok.yml").write_text(f"extends: {PROFILE}\n{override}\n")
    with pytest.raises(PdfleetError) as exc:
        _deploy("tok", lab_manifest, profiles)
    assert expected in str(exc.value) and ".yml: " in str(exc.value), str(exc.value)

"""The weights role (issue 31): on each host serving a staged model, a disk check then one operation per
manifest file fetching it from the model's mirror, restarting that model's instances when a file changed;
nowhere else. A staged model's vLLM unit loads the staged directory offline; the manifests are read only
when the weights role runs on a host that serves a staged model."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from pdfleet.errors import ValidationError
from pdfleet.fleet.deployment import Deployment, DeploymentRequest, load_deployment
from pdfleet.fleet.vllm_args import serve_argv
from pdfleet.lab.model_mirror import LAB_MODEL, build_lab_models, lab_model_files
from pdfleet.model.specs import ModelSpec
from pdfleet.model.weights import WeightsManifest
from pdfleet.ops.files import Directory
from pdfleet.ops.weights import OldRevisions, PushFile, RevisionDirs, StageFile, WeightsSpace
from pdfleet.sim.config import parse_serve_args
from roles import REGISTRY, services, weights
from tests.unit.hw.helpers import HostFacts
from tests.unit.roles.helpers import REPO, exec_start_argv

DIR = f"/var/lib/pdfleet/models/{LAB_MODEL}/lab-r1"


@pytest.fixture(scope="module")
def lab_manifest(tmp_path_factory: pytest.TempPathFactory) -> WeightsManifest:
    return build_lab_models(tmp_path_factory.mktemp("models"))[0]


def _deploy(
    profile: str,
    manifest: WeightsManifest,
    asked: list[list[str]],
    roles: str | None = None,
    profiles: Path = REPO / "profiles",
) -> Deployment:
    """A deployment on the lab inventory whose manifests come from `manifest`, recording what was asked."""

    def manifests(models: Sequence[ModelSpec]) -> Mapping[str, WeightsManifest]:
        asked.append([m.id for m in models])
        return {m.id: manifest for m in models}

    chosen = tuple(r for r in REGISTRY if roles is None or r.NAME in roles.split(","))
    request = DeploymentRequest(
        profile, REPO / "inventory/lab.yml", profiles, REPO / "templates", chosen, manifests=manifests
    )
    return load_deployment(request)


def test_every_pool_host_stages_each_file_and_the_gateway_nothing(lab_manifest: WeightsManifest) -> None:
    asked: list[list[str]] = []
    fleet = _deploy("lab-weights", lab_manifest, asked)
    assert asked == [[LAB_MODEL]]  # read once, for the one staged model
    for name in ("lab-p1", "lab-d1", "lab-colo1", "lab-colo2"):
        ctx = fleet.context(fleet.inventory.hosts[name])
        assert weights.applies(ctx)
        ops = list(weights.operations(ctx, HostFacts({})))
        assert ops[0] == WeightsSpace(DIR, lab_manifest)  # first: refuses before anything is made
        assert [op.path for op in ops[1:3] if isinstance(op, Directory)] == ["/var/lib/pdfleet/models", DIR]
        stage = [op for op in ops if isinstance(op, StageFile)]
        assert [op.file for op in stage] == list(lab_manifest.files)
        assert stage[0].url == f"http://198.18.0.1:8083/{LAB_MODEL}/lab-r1/{lab_manifest.files[0].path}"
        assert {op.limit for op in stage} == {"20M"} and {op.header_file for op in stage} == {None}
        units = {h.unit for h in stage[0].notify}
        assert units == {inst.unit for inst in ctx.instances} and units
        env = next(f for f in services.files(ctx) if f.path.endswith(".env"))
        assert "HF_HUB_OFFLINE=1\n" in env.content and "HF_HOME=/var/lib/pdfleet/hf\n" in env.content
        root = f"/var/lib/pdfleet/models/{LAB_MODEL}"  # last: the other revisions, after the restarts
        assert ops[-1] == OldRevisions(root, "lab-r1", stage[0].notify)
        assert RevisionDirs(root) in weights.facts(ctx)
    assert not weights.applies(fleet.context(fleet.inventory.hosts["lab-gw"]))


def test_unstaged_profiles_read_no_manifest_and_stay_online(lab_manifest: WeightsManifest) -> None:
    asked: list[list[str]] = []
    fleet = _deploy("lab-cross", lab_manifest, asked)
    ctx = fleet.context(fleet.inventory.hosts["lab-d1"])
    assert asked == [] and not weights.applies(ctx)
    env = next(f for f in services.files(ctx) if f.path.endswith(".env"))
    assert "HF_HUB_OFFLINE" not in env.content
    _deploy("lab-weights", lab_manifest, asked, roles="base,services")  # no weights role: nothing read
    _deploy("lab-weights", lab_manifest, asked, roles="weights,services")
    assert asked == [[LAB_MODEL]]


def test_vllm_loads_the_staged_directory_without_a_revision(
    lab_manifest: WeightsManifest, tmp_path: Path
) -> None:
    for name in ("_base", "cross-rdma", "lab-cross", "lab-weights"):
        (tmp_path / f"{name}.yml").write_text((REPO / "profiles" / f"{name}.yml").read_text())
    (tmp_path / "real.yml").write_text("extends: lab-weights\nvllm: {engine: vllm}\n")
    fleet = _deploy("real", lab_manifest, [], profiles=tmp_path)
    host = fleet.inventory.hosts["lab-d1"]
    (inst,) = fleet.topology.on_host("lab-d1")
    argv = serve_argv(fleet.profile, host, inst)
    assert argv[1:3] == ["serve", DIR] and "--revision" not in argv
    assert argv[argv.index("--served-model-name") + 1] == LAB_MODEL  # clients still name it by its id
    unit = next(f for f in services.files(fleet.context(host)) if f.path.endswith(".service"))
    assert exec_start_argv(unit.content)[2] == DIR
    sim = _deploy("lab-weights", lab_manifest, [])
    sim_argv = serve_argv(sim.profile, host, sim.topology.on_host("lab-d1")[0])
    # the simulator is started as vLLM is: from the staged directory, offline, known to clients by the id
    assert sim_argv[1:3] == ["serve", DIR] and "--revision" not in sim_argv
    assert sim_argv[sim_argv.index("--served-model-name") + 1] == LAB_MODEL


def test_the_simulator_reads_the_staged_lab_model_it_is_rendered_to_serve(
    lab_manifest: WeightsManifest, tmp_path: Path
) -> None:
    staged = tmp_path / "lab-r1"
    staged.mkdir()
    for path, data in lab_model_files("lab-r1").items():
        (staged / path).write_bytes(data)
    sim = _deploy("lab-weights", lab_manifest, [])
    host = sim.inventory.hosts["lab-d1"]
    argv = serve_argv(sim.profile, host, sim.topology.on_host("lab-d1")[0])
    cfg = parse_serve_args([str(staged) if word == DIR else word for word in argv[1:]], env={})
    assert cfg.model_dir is not None and cfg.model_dir.architectures == ("LlamaForCausalLM",)
    assert cfg.model_spec.name == "Llama-3.1-8B" and cfg.served_model_names[0] == LAB_MODEL
    assert cfg.tokenizer == str(staged / "tokenizer.json")  # tokenizers is installed here (dev extra)
    (staged / "config.json").unlink()
    with pytest.raises(ValidationError, match=f"{staged}/config.json: missing"):
        parse_serve_args([str(staged) if word == DIR else word for word in argv[1:]], env={})


def test_a_missing_manifest_is_a_clear_error(lab_manifest: WeightsManifest) -> None:
    fleet = _deploy("lab-weights", lab_manifest, [])
    ctx = dataclasses.replace(fleet.context(fleet.inventory.hosts["lab-d1"]), manifests={})
    with pytest.raises(Exception, match=f"{LAB_MODEL} at lab-r1: its weights manifest was not read"):
        weights.facts(ctx)


def test_a_control_machine_directory_is_pushed_with_the_limit(
    lab_manifest: WeightsManifest, tmp_path: Path
) -> None:
    for name in ("_base", "cross-rdma", "lab-cross", "lab-weights"):
        (tmp_path / f"{name}.yml").write_text((REPO / "profiles" / f"{name}.yml").read_text())
    (tmp_path / "pushed.yml").write_text("extends: lab-weights\nmodel: {source: /srv/models}\n")
    fleet = _deploy("pushed", lab_manifest, [], profiles=tmp_path)
    ctx = fleet.context(fleet.inventory.hosts["lab-d1"])
    stage = [op for op in weights.operations(ctx, HostFacts({})) if isinstance(op, StageFile)]
    assert stage and all(isinstance(op, PushFile) for op in stage)
    assert [op.url for op in stage] == [
        f"/srv/models/{LAB_MODEL}/lab-r1/{f.path}" for f in lab_manifest.files
    ]
    assert {op.limit for op in stage} == {"20M"} and {op.header_file for op in stage} == {None}

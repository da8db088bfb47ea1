"""Staged weights: every file of each staged model the host serves is in its revision's directory with
the manifest's SHA-256 (one batched sha256sum per revision, the fact provision reads)."""

from __future__ import annotations

from typing import Any

import pytest

from pdfleet.checks.verify import VerifyPlugin
from pdfleet.fleet.weights import staged_dir
from pdfleet.model.inventory import Host
from pdfleet.ops.weights import StagedFiles, missing_files


def test_staged_weights_match_manifest(verify: VerifyPlugin, pd_host: Host, target: Any) -> None:
    models = {
        spec.model.id: spec.model
        for inst in verify.topology.on_host(pd_host.name)
        if (spec := verify.profile.served_model(inst.model)).model.staged
    }
    if not models:
        pytest.skip("serves no staged model under this profile (model.source unset)")
    facts = verify.facts(pd_host)
    bad = []
    for model in models.values():
        manifest = verify.manifests[model.id]
        directory = staged_dir(model)
        state = facts.get(StagedFiles(directory, tuple(f.path for f in manifest.files)))
        for file in missing_files(manifest, state):
            have = state.sha256.get(file.path)
            what = "missing" if have is None else f"sha256 {have[:12]}, manifest {file.sha256[:12]}"
            bad.append(f"{directory}/{file.path}: {what}")
    assert not bad, f"{len(bad)} staged file(s) differ from the manifest: " + "; ".join(bad)

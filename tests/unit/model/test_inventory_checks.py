"""Profile vs inventory: groups for the topology, GPU indices per host, ports per host, RDMA devices."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdfleet.errors import ValidationError
from pdfleet.model.inventory import load_inventory
from pdfleet.model.inventory_checks import check_against_inventory
from pdfleet.model.profile import ProfileError
from pdfleet.model.profile_loader import list_profiles, load_profile
from tests.unit.model.helpers import GOOD, PROFILES, REPO, SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profile_fits_its_example_inventory(name: str) -> None:
    profile = load_profile(name, PROFILES)
    check_against_inventory(profile, load_inventory(REPO / f"inventory/examples/{name}.yml"))
    assert profile.name == name and profile.source == PROFILES / f"{name}.yml"
    assert profile.extends == "_base"


def _fits(profile_name: str, inventory: Path) -> bool:
    try:
        check_against_inventory(load_profile(profile_name, PROFILES), load_inventory(inventory))
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize("name", list_profiles(PROFILES))
def test_every_profile_fits_some_inventory_in_the_repo(name: str) -> None:
    """A profile no inventory in the repo can run is a broken example (lab profiles included)."""
    inventories = sorted((REPO / "inventory").glob("**/*.yml"))
    assert any(_fits(name, inv) for inv in inventories), f"{name} fits none of {inventories}"


CROSS_INV = """
all:
  children:
    prefill:
      hosts:
        p1: {ansible_host: 10.0.0.21, gpus: [0, 1], rdma_devices: [mlx5_0], rdma_netdev: eth1}
    decode:
      hosts:
        d1: {ansible_host: 10.0.0.31, gpus: [0, 1], rdma_devices: [mlx5_0], rdma_netdev: eth1}
    gateway:
      hosts:
        gw: {ansible_host: 10.0.0.10}
"""


SAME_INV = """
all:
  children:
    prefill:
      hosts: {pd1: {ansible_host: 10.0.0.40, gpus: [0, 1]}}
    decode:
      hosts: {pd1: }
"""


COLO_INV = "all:\n  children:\n    colocated:\n      hosts: {c1: {gpus: [0]}}\n"


# (id, file the key path is set in (the case file or the base _good), profile overrides over GOOD
# (cross-host), inventory text, key path, expected text)
CASES: list[tuple[str, str, str, str, str, str]] = [
    (
        "gpu_index_not_on_host",
        "gpu_index_not_on_host",
        "pools: {decode: {gpus: [2]}}\n",
        CROSS_INV,
        "pools.decode.gpus",
        "GPU 2 is not on host d1 ({inv} declares gpus [0, 1])",
    ),
    (
        "host_declares_no_gpus",
        "_good",
        "",
        CROSS_INV.replace(
            "gpus: [0, 1], rdma_devices: [mlx5_0], rdma_netdev: eth1}\n    decode",
            "rdma_devices: [mlx5_0], rdma_netdev: eth1}\n    decode",
        ),
        "pools.prefill.gpus",
        "host p1 declares no gpus in {inv} (inventory var gpus, e.g. [0, 1])",
    ),
    (
        "cross_host_needs_distinct_hosts",
        "_good",
        "rdma: {enabled: false}\n",
        SAME_INV,
        "topology",
        "cross-host needs distinct prefill and decode hosts; pd1 in {inv} is in both",
    ),
    (
        "same_gpu_two_pools_one_host",
        "_good",
        "rdma: {enabled: false}\n",
        SAME_INV,
        "pools.decode.gpus",
        "GPU 0 is given to both pools.prefill and pools.decode on host pd1",
    ),
    (
        "same_host_needs_shared_host",
        "same_host_needs_shared_host",
        "topology: same-host\npools: {decode: {gpus: [1]}}\n",
        CROSS_INV,
        "topology",
        "same-host needs a host in both groups prefill and decode; in {inv} prefill is p1 and decode is d1",
    ),
    (
        "same_host_host_in_one_group_only",
        "same_host_host_in_one_group_only",
        "topology: same-host\npools: {decode: {gpus: [1]}}\nrdma: {enabled: false}\n",
        SAME_INV.replace("hosts: {pd1: }", "hosts: {pd1: , d9: {gpus: [0, 1]}}"),
        "topology",
        "d9 in {inv} is in only one of the groups prefill/decode",
    ),
    (
        "colocated_needs_colocated_group",
        "colocated_needs_colocated_group",
        "topology: colocated\npools:\n  prefill: null\n  decode: null\n"
        "  colocated: {port: 8000, gpus: [0], max_num_batched_tokens: 8192, gpu_memory_utilization: 0.9}\n",
        CROSS_INV,
        "topology",
        "colocated needs hosts in group colocated; {inv} has groups: prefill, decode, gateway",
    ),
    (
        "cross_host_missing_decode_group",
        "_good",
        "",
        COLO_INV,
        "topology",
        "cross-host needs hosts in group decode",
    ),
    (
        "gateway_port_reused_on_prefill_host",
        "gateway_port_reused_on_prefill_host",
        "gateway: {port: 8100}\n",
        CROSS_INV.replace(
            "    gateway:\n      hosts:\n        gw: {ansible_host: 10.0.0.10}",
            "    gateway:\n      hosts:\n        p1:",
        ),
        "gateway.port",
        "port 8100 is used twice on host p1: by pools.prefill.port and gateway.port",
    ),
    (
        "side_channel_port_reused_on_gateway_host",
        "side_channel_port_reused_on_gateway_host",
        "gateway: {admin_port: 5600}\n",
        CROSS_INV.replace(
            "    gateway:\n      hosts:\n        gw: {ansible_host: 10.0.0.10}",
            "    gateway:\n      hosts:\n        p1:",
        ),
        "gateway.admin_port",
        "port 5600 is used twice on host p1: by kv_transfer.side_channel_port (prefill side channel) "
        "and gateway.admin_port",
    ),
    (
        "rdma_host_without_devices",
        "_good",
        "",
        CROSS_INV.replace(
            "d1: {ansible_host: 10.0.0.31, gpus: [0, 1], rdma_devices: [mlx5_0], rdma_netdev: eth1}",
            "d1: {ansible_host: 10.0.0.31, gpus: [0, 1]}",
        ),
        "rdma.enabled",
        "host d1 declares no rdma_devices in {inv} (e.g. [mlx5_0])",
    ),
    (
        "cross_host_loopback_address",
        "_good",
        "",
        CROSS_INV.replace("10.0.0.21", "127.0.0.1"),
        "kv_transfer.side_channel_host",
        "auto uses host p1's address '127.0.0.1', which other hosts cannot reach",
    ),
]


@pytest.mark.parametrize(
    ("case", "origin", "overrides", "inventory", "key_path", "expected"), CASES, ids=[c[0] for c in CASES]
)
def test_profile_against_inventory(
    tmp_path: Path, case: str, origin: str, overrides: str, inventory: str, key_path: str, expected: str
) -> None:
    (tmp_path / "_good.yml").write_text(GOOD)
    profile_path = tmp_path / f"{case}.yml"
    profile_path.write_text("extends: _good\n" + overrides)
    inv_path = tmp_path / "inv.yml"
    inv_path.write_text(inventory)
    profile = load_profile(case, tmp_path)  # the profile itself is valid; only the hosts make it wrong
    with pytest.raises(ProfileError) as err:
        check_against_inventory(profile, load_inventory(inv_path))
    prefix = f"{tmp_path / origin}.yml: {key_path}: "
    wanted = expected.format(inv=inv_path)
    lines = err.value.problems
    assert any(line.startswith(prefix) and wanted in line for line in lines), "\n".join(lines)


COLO_POOL = (
    "pools: {colocated: {port: 8000, gpus: [0], max_num_batched_tokens: 8192, gpu_memory_utilization: 0.9}}\n"
)
COLO_HOST = "    colocated:\n      hosts:\n        c1: {ansible_host: 10.0.0.11, gpus: [0]}\n"


def test_good_profile_fits_good_inventory(tmp_path: Path) -> None:
    (tmp_path / "_good.yml").write_text(GOOD)
    (tmp_path / "ok.yml").write_text("extends: _good\n" + COLO_POOL)
    inv = tmp_path / "inv.yml"
    inv.write_text(CROSS_INV + COLO_HOST)
    check_against_inventory(load_profile("ok", tmp_path), load_inventory(inv))


def test_a_gateway_host_with_no_colocated_pool_to_route_to_is_an_error(tmp_path: Path) -> None:
    """Before: the gateway host silently got no gateway. Now the check names the host and the fix."""
    (tmp_path / "_good.yml").write_text(GOOD)
    (tmp_path / "ok.yml").write_text("extends: _good\n")
    inv = tmp_path / "inv.yml"
    inv.write_text(CROSS_INV)
    with pytest.raises(ProfileError) as err:
        check_against_inventory(load_profile("ok", tmp_path), load_inventory(inv))
    want = f"{tmp_path / '_good.yml'}: pools.colocated: host gw is in group gateway of {inv}"
    assert any(line.startswith(want) and "would get no gateway" in line for line in err.value.problems), (
        err.value.problems
    )

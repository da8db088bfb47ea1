"""RDMA bandwidth per prefill/decode host pair (`--rdma-bandwidth`): ib_write_bw >= the profile minimum."""

from __future__ import annotations

import shlex
import time

import pytest

from pdfleet.checks.verify import VerifyPlugin, parse_ib_write_bw, read_env, remote_fact
from pdfleet.fleet.host_layout import KV_ENV_FILE
from pdfleet.hw.kv import uses_rdma
from pdfleet.hw.rdma import netdev_of
from pdfleet.hw.rdma_facts import NetdevFact, RdmaSysfsFact
from pdfleet.model.inventory import Host

PORT = 18515  # perftest's default TCP port for the out-of-band exchange
SECONDS = 5


def test_ib_write_bw(verify: VerifyPlugin, pd_pair: tuple[Host, Host]) -> None:
    prefill, decode = pd_pair
    if not verify.options.rdma_bandwidth:
        pytest.skip("--rdma-bandwidth not given")
    if not (uses_rdma(verify.kv_profile(prefill), prefill) and uses_rdma(verify.kv_profile(decode), decode)):
        pytest.skip("KV does not move over RDMA between these hosts")
    minimum = verify.profile.rdma.min_bandwidth_gbps
    if minimum is None:
        pytest.skip("rdma.min_bandwidth_gbps is not set")
    server, client = verify.target_for(decode), verify.target_for(prefill)
    gid = (read_env(server, KV_ENV_FILE) or {}).get("UCX_IB_GID_INDEX")
    assert gid is not None, f"{decode.name}: {KV_ENV_FILE} has no UCX_IB_GID_INDEX"
    sdev, cdev = decode.rdma_devices[0], prefill.rdma_devices[0]
    nd = netdev_of(remote_fact(server, RdmaSysfsFact()), (sdev,)).get(sdev)
    addrs = remote_fact(server, NetdevFact(nd)).ipv4 if nd else ()
    assert addrs, f"{decode.name}: {sdev} has no netdev with an IPv4 address"
    args = f"-x {int(gid)} -p {PORT} --report_gbits -D {SECONDS} -F"
    server.run(
        f"nohup timeout {SECONDS * 6} ib_write_bw -d {shlex.quote(sdev)} {args} "
        "> /tmp/pdfleet-ib_write_bw.log 2>&1 &"
    )
    time.sleep(1)  # the server must listen before the client connects
    out = client.run(
        f"timeout {SECONDS * 5} ib_write_bw -d {shlex.quote(cdev)} {args} {shlex.quote(addrs[0])}"
    )
    bw = parse_ib_write_bw(out.stdout)
    assert bw is not None, f"ib_write_bw printed no result: {(out.stdout + out.stderr).strip()[-300:]}"
    assert bw >= minimum, f"{prefill.name}->{decode.name}: {bw} Gb/s < rdma.min_bandwidth_gbps {minimum}"

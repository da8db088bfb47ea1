"""The dashboard's host rows: what every host's node exporter (job `node`, labelled with the host and what
it runs) says about CPU, memory, filesystems, disks, network devices (the RDMA netdev among them, by its
name) and RDMA ports (the infiniband collector's counters: RoCE traffic the netdev's counters may not
show). Rates over the profile's `monitoring.rule_window_s`, as the recorded series use.

NVIDIA's DCGM exporter is not installed (roles/node_exporter says why), so there is no GPU row: vLLM's
own KV-cache panels stand in for GPU memory.
"""

from __future__ import annotations

from pdfleet.model.profile import Profile
from pdfleet.monitoring.panels import Panel, Query

NODE = 'job="node"'
# filesystems that hold data: not the kernel's, not memory (the node exporter already leaves overlays out)
REAL_FS = 'fstype!~"tmpfs|ramfs|devtmpfs|squashfs|nsfs|fuse.lxcfs"'
IDLE = 'mode="idle"'
NOT_LO = 'device!="lo"'
DEVICE, MOUNT, PORT = "{{host}} {{device}}", "{{host}} {{mountpoint}}", "{{host}} {{device}}:{{port}}"
HOST_ROWS = ("Hosts: CPU, memory, disks", "Hosts: network and RDMA")


def _rate(series: str, window_s: int, match: str = "") -> str:
    labels = ", ".join(m for m in (NODE, match) if m)
    return f"rate({series}{{{labels}}}[{window_s}s])"


def _bits(series: str, window_s: int, match: str = "") -> str:
    return f"8 * {_rate(series, window_s, match)}"


def host_rows(profile: Profile) -> list[tuple[str, list[Panel]]]:
    """(row title, panels) of the hosts, after the chain's rows."""
    w = profile.monitoring.rule_window_s
    idle = _rate("node_cpu_seconds_total", w, IDLE)
    memory = f"1 - node_memory_MemAvailable_bytes{{{NODE}}} / node_memory_MemTotal_bytes{{{NODE}}}"
    fs = f"{{{NODE}, {REAL_FS}}}"
    compute = [
        Panel("CPU busy per host", (Query(f"1 - avg by (host) ({idle})", "{{host}}"),), unit="percentunit"),
        Panel("Memory in use per host", (Query(memory, "{{host}}"),), unit="percentunit"),
        Panel(
            "Filesystem space used",
            (Query(f"1 - node_filesystem_avail_bytes{fs} / node_filesystem_size_bytes{fs}", MOUNT),),
            unit="percentunit",
            description="A full disk stops vLLM's logs, Prometheus's storage and staged weights.",
        ),
        Panel(
            "Disk busy (time doing I/O)",
            (Query(_rate("node_disk_io_time_seconds_total", w), DEVICE),),
            unit="percentunit",
        ),
    ]
    network = [
        Panel(
            "Network received per device (the RDMA netdev among them)",
            (Query(_bits("node_network_receive_bytes_total", w, NOT_LO), DEVICE),),
            unit="bps",
        ),
        Panel(
            "Network sent per device (the RDMA netdev among them)",
            (Query(_bits("node_network_transmit_bytes_total", w, NOT_LO), DEVICE),),
            unit="bps",
        ),
        Panel(
            "RDMA port traffic (KV transfer over RoCE/InfiniBand)",
            (
                Query(_bits("node_infiniband_port_data_received_bytes_total", w), f"{PORT} rx"),
                Query(_bits("node_infiniband_port_data_transmitted_bytes_total", w), f"{PORT} tx"),
            ),
            unit="bps",
            description="The infiniband collector's port counters (/sys/class/infiniband): RDMA traffic "
            "bypasses the kernel's network stack, so the netdev's own counters may not show it.",
        ),
    ]
    return [(HOST_ROWS[0], compute), (HOST_ROWS[1], network)]

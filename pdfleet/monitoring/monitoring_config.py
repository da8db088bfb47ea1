"""Prometheus's configuration for a deployment, from the topology: one scrape job per kind of service.

Jobs `vllm` (every pool instance, simulator or vLLM), `vllm-router`, `pdfleet-gateway` (over https,
verified against the gateway's CA, under gateway.tls), `node` (every host's node exporter) and
`prometheus` itself, alerts sent to the Alertmanager beside it; every target carries the labels `pool`,
`role` and `host` the topology gives it (a node exporter: what its host runs), and an `instance` label
naming the host (not its address). Written with a YAML dumper from data, never by pasting text, so no
inventory or profile value can add a line to the file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from pdfleet.errors import ValidationError
from pdfleet.fleet.host_layout import GATEWAY_CA_FILE
from pdfleet.fleet.topology import MetricsEndpoint, Prometheus, Topology
from pdfleet.model.profile import Profile

CONFIG_DIR = "/etc/prometheus"
CONFIG_FILE = f"{CONFIG_DIR}/prometheus.yml"
RULES_DIR = f"{CONFIG_DIR}/pdfleet"
RECORDING_FILE = f"{RULES_DIR}/recording.yml"
ALERTS_FILE = f"{RULES_DIR}/alerts.yml"
DEFAULTS_FILE = "/etc/default/prometheus"  # Debian's unit reads ARGS from here
STORAGE_DIR = "/var/lib/prometheus/metrics2"  # the Debian package's storage path
JOB_ORDER = ("prometheus", "vllm", "vllm-router", "pdfleet-gateway", "node")
# vLLM serves /metrics with prometheus_client, whose OpenMetrics encoder (what Prometheus 2.x asks for
# first) writes `vllm:x` as `vllm_x` in recent releases; this puts the real names back, so rules and
# dashboards use vLLM's names whichever format a server answered in. No vLLM metric starts `vllm_`.
VLLM_NAME_RELABEL: dict[str, Any] = {
    "source_labels": ["__name__"],
    "regex": "vllm_(.+)",
    "target_label": "__name__",
    "replacement": "vllm:$1",
}


def _static(endpoint: MetricsEndpoint) -> dict[str, Any]:
    """One target with its topology labels; `instance` names the host and port."""
    labels = {**dict(endpoint.labels), "instance": f"{endpoint.host}:{endpoint.port}"}
    return {"targets": [f"{endpoint.address}:{endpoint.port}"], "labels": labels}


def scrape_jobs(endpoints: Sequence[MetricsEndpoint]) -> list[dict[str, Any]]:
    """scrape_configs: one job per kind of service, in JOB_ORDER, targets in topology order."""
    by_job: dict[str, list[MetricsEndpoint]] = {}
    for endpoint in endpoints:
        by_job.setdefault(endpoint.job, []).append(endpoint)
    jobs = []
    for job in sorted(by_job, key=lambda j: (JOB_ORDER.index(j) if j in JOB_ORDER else len(JOB_ORDER), j)):
        config: dict[str, Any] = {"job_name": job, "static_configs": [_static(e) for e in by_job[job]]}
        if any(e.scheme == "https" for e in by_job[job]):  # a TLS gateway: verified against its CA
            config |= {"scheme": "https", "tls_config": {"ca_file": GATEWAY_CA_FILE}}
        if job == "vllm":
            config["metric_relabel_configs"] = [dict(VLLM_NAME_RELABEL)]
        jobs.append(config)
    return jobs


def prometheus_config(profile: Profile, topology: Topology, server: Prometheus) -> str:
    """prometheus.yml for a monitoring host's server: intervals from the profile, itself and every endpoint
    of the topology."""
    mon = profile.monitoring
    doc: dict[str, Any] = {
        "global": {
            "scrape_interval": f"{mon.scrape_interval_s}s",
            "scrape_timeout": f"{min(10, mon.scrape_interval_s)}s",
            "evaluation_interval": f"{mon.evaluation_interval_s}s",
            "external_labels": {"profile": profile.name},
        },
        "rule_files": [RECORDING_FILE, ALERTS_FILE],
        "scrape_configs": scrape_jobs([server.metrics_endpoint, *topology.metrics_endpoints]),
    }
    am = server.alertmanager
    if am is not None:  # the Alertmanager beside it, on the same host
        doc["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [f"{am.address}:{am.port}"]}]}]}
    return "# Managed by pdfleet (roles/monitoring): the topology's metrics endpoints.\n" + dump(doc)


def prometheus_args(profile: Profile, server: Prometheus) -> list[str]:
    """The daemon's flags (Debian's unit passes $ARGS from /etc/default/prometheus)."""
    mon = profile.monitoring
    args = [
        f"--config.file={CONFIG_FILE}",
        f"--storage.tsdb.path={STORAGE_DIR}",
        f"--storage.tsdb.retention.time={mon.retention_days}d",
        f"--web.listen-address={server.listen_address}",
    ]
    if mon.retention_size_gb is not None:
        args.append(f"--storage.tsdb.retention.size={mon.retention_size_gb}GB")
    return args


def defaults_file(profile: Profile, server: Prometheus) -> str:
    """/etc/default/prometheus: ARGS only (each flag is built from validated numbers and an address)."""
    args = " ".join(prometheus_args(profile, server))
    if any(c in args for c in '"$\\`\n\r'):  # the inventory should refuse such an address; be sure
        raise ValidationError(
            f"inventory: host {server.host}: address {server.address!r} cannot be written into "
            f"{DEFAULTS_FILE} (quotes, $, backslashes or newlines); use a plain IP or name"
        )
    return f'# Managed by pdfleet (roles/monitoring).\nARGS="{args}"\n'


def dump(doc: Mapping[str, Any]) -> str:
    """YAML as Prometheus reads it: block style, keys in the order given, any string safely quoted."""
    return yaml.safe_dump(
        dict(doc), sort_keys=False, default_flow_style=False, allow_unicode=False, width=4096
    )

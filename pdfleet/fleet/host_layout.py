"""Where pdfleet puts things on a host, and the user its services run as: one place for every role."""

from pdfleet.ops.unit_health import GATEWAY_CA_FILE as PROBE_CA_FILE

SERVICE_USER = "pdfleet"
STATE_DIR = "/var/lib/pdfleet"
CONFIG_DIR = "/etc/pdfleet"  # env files (0600, read by systemd as root) and per-service config dirs
UNIT_DIR = "/etc/systemd/system"
HOST_CODE_DIR = "/opt/pdfleet"  # the venvs of the programs the host wheel carries
WHEEL_DIR = f"{HOST_CODE_DIR}/wheels"  # this clone's host wheel, uploaded by provision
KV_ENV_FILE = f"{CONFIG_DIR}/kv-transfer.env"
# The CA of the gateway's certificate (the profile's gateway.tls.ca_file), on every host that calls a TLS
# gateway: the gateway hosts (their health probe), the monitoring host (Prometheus, the controller)
GATEWAY_CA_FILE = PROBE_CA_FILE
# the gateway's own certificate (gateway.tls.cert_file, 0644) and key (0600), beside its policy
GATEWAY_TLS_CERT_FILE = f"{CONFIG_DIR}/gateway/tls.crt"
GATEWAY_TLS_KEY_FILE = f"{CONFIG_DIR}/gateway/tls.key"
# A 70B model can take many minutes to load; vLLM answers /health only after.
VLLM_START_TIMEOUT_S = 1800
# Staged model weights: <id>/<revision>/ each (roles/weights), read-only to the service user.
MODELS_DIR = f"{STATE_DIR}/models"

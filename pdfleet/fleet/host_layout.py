"""Where pdfleet puts things on a host, and the user its services run as: one place for every role."""

SERVICE_USER = "pdfleet"
STATE_DIR = "/var/lib/pdfleet"
CONFIG_DIR = "/etc/pdfleet"  # env files (0600, read by systemd as root) and per-service config dirs
UNIT_DIR = "/etc/systemd/system"
HOST_CODE_DIR = "/opt/pdfleet"  # the venvs of the programs the host wheel carries
WHEEL_DIR = f"{HOST_CODE_DIR}/wheels"  # this clone's host wheel, uploaded by provision
KV_ENV_FILE = f"{CONFIG_DIR}/kv-transfer.env"
# A 70B model can take many minutes to load; vLLM answers /health only after.
VLLM_START_TIMEOUT_S = 1800
# Staged model weights: <id>/<revision>/ each (roles/weights), read-only to the service user.
MODELS_DIR = f"{STATE_DIR}/models"

"""Where the lab keeps things on the control machine, and the fixed network facts of the lab."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

DEFAULT_ROOT = Path("/var/lib/pdfleet-lab")
BRIDGE = "pdlab0"
NETWORK = ipaddress.IPv4Network("198.18.0.0/24")
BRIDGE_ADDRESS = "198.18.0.1"
APT_PORT = 8081
PYPI_PORT = 8082
MODELS_PORT = 8083  # the model mirror (pdfleet.lab.model_mirror)
LOGIN_USER = "ops"


@dataclass(frozen=True)
class LabPaths:
    """Every path the lab reads or writes, derived from one state root (see pdfleet.lab's docstring)."""

    root: Path = DEFAULT_ROOT

    @property
    def ssh_dir(self) -> Path:
        return self.root / "ssh"

    @property
    def key_file(self) -> Path:
        return self.ssh_dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.ssh_dir / "known_hosts"

    @property
    def image_dir(self) -> Path:
        return self.root / "image"

    @property
    def hosts_dir(self) -> Path:
        return self.root / "hosts"

    def host_dir(self, name: str) -> Path:
        return self.hosts_dir / name

    @property
    def mirrors_dir(self) -> Path:
        return self.root / "mirrors"

    @property
    def apt_served(self) -> Path:
        """A symlink to the apt repository being served; swapped atomically when it is rebuilt."""
        return self.mirrors_dir / "apt"

    @property
    def pypi_dir(self) -> Path:
        return self.mirrors_dir / "pypi"

    @property
    def models_dir(self) -> Path:
        """The model mirror's root: <model id>/<revision>/ with files and manifest.json."""
        return self.mirrors_dir / "models"

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def gateway_client_key(self) -> Path:
        """The gateway client key the lab's provisioning leaves for `lab.env` (mode 0600)."""
        return self.root / "gateway-client.key"

    @property
    def tls_dir(self) -> Path:
        """The lab CA and the lab gateway's certificate (pdfleet.lab.pki; lab-cross names these files)."""
        return self.root / "tls"

    @property
    def gateway_admin_key(self) -> Path:
        """The gateway's admin key (for /admin/*), kept beside the client key (mode 0600)."""
        return self.root / "gateway-admin.key"

    @property
    def gateway_controller_key(self) -> Path:
        """The rollout controller's stage-only key (its host gets it; the gateways its hash), mode 0600."""
        return self.root / "gateway-controller.key"

    @property
    def gateway_keys_dir(self) -> Path:
        """The named client keys of `invoke keys.*` (registry and NAME.key files; lab profiles name it)."""
        return self.root / "gateway-keys"


def apt_mirror_url() -> str:
    """The apt mirror as lab hosts (and lab profiles' mirrors.apt) address it."""
    return f"http://{BRIDGE_ADDRESS}:{APT_PORT}/"


def pypi_mirror_url() -> str:
    """The PEP 503 index as lab hosts (and lab profiles' mirrors.pypi) address it."""
    return f"http://{BRIDGE_ADDRESS}:{PYPI_PORT}/simple/"


def models_mirror_url() -> str:
    """The model mirror as lab hosts (and lab profiles' model.source) address it."""
    return f"http://{BRIDGE_ADDRESS}:{MODELS_PORT}/"

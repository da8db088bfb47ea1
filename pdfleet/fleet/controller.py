"""The rollout controller's place and paths: installed on the first monitoring host (fleet.topology says
whether and where), with its venv, configuration, admin key and state directory."""

from __future__ import annotations

from dataclasses import dataclass

from pdfleet.model.inventory import Host
from pdfleet.model.profile import Profile
from pdfleet.rollout.config import DEFAULT_CONFIG, STATE_DIR


@dataclass(frozen=True)
class Controller:
    """The rollout controller (pdfleet-rollout) on the first monitoring host: where it is installed, reads
    its configuration and the gateways' admin key, and keeps its state."""

    host: Host
    venv: str = "/opt/pdfleet/rollout"
    config_file: str = str(DEFAULT_CONFIG)  # the controller's own default (pdfleet.rollout.config)
    key_file: str = str(DEFAULT_CONFIG.parent / "admin.key")
    state_dir: str = str(STATE_DIR)
    unit: str = "pdfleet-rollout.service"

    @property
    def config_dir(self) -> str:
        return self.config_file.rsplit("/", 1)[0]

    @property
    def bin(self) -> str:
        return f"{self.venv}/bin/pdfleet-rollout"


def placement(
    profile: Profile, controller: Controller | None, has_gateways: bool, group: str
) -> tuple[Controller | None, str | None]:
    """The rollout controller and None, or None and why it is not installed (`controller`: where it would
    run, the first host of the monitoring `group`)."""
    if controller is None:
        return None, f"the inventory has no host in the `{group}` group"
    if not has_gateways:
        return None, "the topology has no gateway: there is no stage to roll out"
    if not any(spec.rollout.plans for spec in profile.served):
        return None, "the profile has no rollout.plans"
    return controller, None

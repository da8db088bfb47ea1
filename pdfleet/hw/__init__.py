"""Hardware facts (GPU, driver, kernel, Secure Boot, RDMA, QoS) and the pure decisions built on them.

`gpu_facts` and `rdma_facts` hold the commands and parsers (`sections` splits their combined
outputs); `gpu`, `rdma` and `kv` turn parsed facts plus the profile into what a role should do, or
why it skips, without touching a host, so every decision is unit-tested against fixtures taken
from documented output formats.
"""

from pdfleet.errors import PdfleetError

__all__ = ["HardwareError"]


class HardwareError(PdfleetError):
    """The host's hardware contradicts the inventory or profile, or a change would be unsafe."""

"""The lab's base image: a debootstrap Debian root, cached by a key over its recipe.

The image is built once and reused until its recipe (suite, mirror, package list, customisation
version) changes; hosts never write to it (each host has its own overlay upper dir).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from pdfleet.lab.paths import LOGIN_USER
from pdfleet.lab.system import LabError, Progress, atomic_write, run, run_streaming

SUITE = "bookworm"
FALLBACK_MIRROR = "http://deb.debian.org/debian"
# What a "bare-metal" lab host has before pdfleet touches it (plus kmod/pciutils/procps, which
# hardware detection and facts read on any real Debian server).
PACKAGES: tuple[str, ...] = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "libpam-systemd",
    "openssh-server",
    "python3",
    "python3-venv",
    "sudo",
    "curl",
    "ca-certificates",
    "iproute2",
    "procps",
    "kmod",
    "pciutils",
)
# Bump when the customisation below changes, so cached images are rebuilt.
RECIPE_VERSION = 4

SSHD_DROPIN = """\
# pdfleet lab: per-host keys (generated at lab.up, never shared), keys only.
HostKey /etc/ssh/ssh_host_ed25519_key
HostKey /etc/ssh/ssh_host_ecdsa_key
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
UseDNS no
"""
# Debian starts sshd and systemd-user-sessions side by side after network.target; until the latter
# removes /run/nologin, sshd accepts a key and then PAM hangs up ("transport shut down or saw EOF").
# Ordering sshd after it (as getty is) closes that window: a lab host listens only once logins work.
SSH_UNIT_DROPIN = """\
[Unit]
After=systemd-user-sessions.service
"""


@dataclass(frozen=True)
class ImageRecipe:
    """Everything that decides the image's content; its hash names the cache entry."""

    suite: str
    mirror: str
    packages: tuple[str, ...]
    version: int = RECIPE_VERSION

    @property
    def key(self) -> str:
        blob = json.dumps([self.suite, self.mirror, sorted(self.packages), self.version]).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def host_debian_mirror(apt_dir: Path = Path("/etc/apt")) -> str:
    """The Debian archive URI this machine's apt uses (so debootstrap and the lab mirror agree)."""
    candidates: list[str] = []
    for path in sorted(apt_dir.glob("sources.list.d/*.sources")):
        candidates += re.findall(r"^URIs:\s*(\S+)", path.read_text(), flags=re.M)
    for path in [apt_dir / "sources.list", *sorted(apt_dir.glob("sources.list.d/*.list"))]:
        if path.exists():
            candidates += re.findall(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)", path.read_text(), flags=re.M)
    for uri in candidates:
        if uri.rstrip("/").endswith("/debian"):
            return uri.rstrip("/")
    return FALLBACK_MIRROR


def default_recipe() -> ImageRecipe:
    """The lab's image recipe on this machine (its Debian mirror is part of the cache key)."""
    return ImageRecipe(SUITE, host_debian_mirror(), PACKAGES)


def image_ready(image_dir: Path, recipe: ImageRecipe) -> bool:
    """Whether a finished build of this recipe is cached (a killed build leaves no COMPLETE marker)."""
    return (image_dir / recipe.key / "COMPLETE").exists()


def ensure_image(image_dir: Path, recipe: ImageRecipe, progress: Progress) -> Path:
    """The cached image's root for this recipe, building it first when it is missing or incomplete."""
    final = image_dir / recipe.key
    if image_ready(image_dir, recipe):
        progress(f"image {recipe.key}: cached")
        return final / "rootfs"
    partial = image_dir / f"{recipe.key}.partial"
    if partial.exists():  # left by a killed build
        shutil.rmtree(partial)
    if final.exists():
        shutil.rmtree(final)
    debs = image_dir / "debs"  # debootstrap's .deb cache: a recipe change re-downloads only new packages
    debs.mkdir(parents=True, exist_ok=True)
    rootfs = partial / "rootfs"
    rootfs.mkdir(parents=True)
    progress(f"image {recipe.key}: debootstrap {recipe.suite} from {recipe.mirror} (cold: about a minute)")
    run_streaming(
        [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(recipe.packages)}",
            f"--cache-dir={debs}",
            recipe.suite,
            str(rootfs),
            recipe.mirror,
        ],
        "debootstrap",
        progress,
        partial / "debootstrap.log",
    )
    progress(f"image {recipe.key}: customising (user {LOGIN_USER}, sshd, networkd)")
    customise(rootfs)
    atomic_write(
        partial / "COMPLETE",
        json.dumps({"suite": recipe.suite, "mirror": recipe.mirror, "packages": sorted(recipe.packages)})
        + "\n",
    )
    partial.rename(final)
    return final / "rootfs"


def prune_images(image_dir: Path, keep: str) -> None:
    """Delete cached images other than `keep` (call only when no host overlay uses them)."""
    if not image_dir.exists():
        return
    for entry in image_dir.iterdir():
        if entry.is_dir() and entry.name not in ("debs", keep):
            shutil.rmtree(entry)


def customise(root: Path) -> None:
    """Turn the debootstrap root into a lab host template: login user, sshd, networkd, no identity."""
    chroot = ["chroot", str(root)]
    run([*chroot, "useradd", "--create-home", "--shell", "/bin/bash", LOGIN_USER])
    run([*chroot, "usermod", "--password", "*", LOGIN_USER])  # no password, key login only
    atomic_write(root / "etc/sudoers.d" / LOGIN_USER, f"{LOGIN_USER} ALL=(ALL) NOPASSWD:ALL\n", 0o440)
    atomic_write(root / "etc/ssh/sshd_config.d/10-pdfleet-lab.conf", SSHD_DROPIN)
    atomic_write(root / "etc/systemd/system/ssh.service.d/10-pdfleet-lab.conf", SSH_UNIT_DROPIN)
    run([*chroot, "systemctl", "enable", "systemd-networkd"])
    # Timers that would reach for the internet on a host that has none.
    run([*chroot, "systemctl", "mask", "apt-daily.timer", "apt-daily-upgrade.timer"])
    # Identity is per host: no shared host keys or machine-id in the image.
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    atomic_write(root / "etc/machine-id", "")
    # No upstream archive: the base role points apt at the lab mirror.
    atomic_write(root / "etc/apt/sources.list", "# pdfleet lab: no upstream archive; see sources.list.d/\n")
    shutil.rmtree(root / "var/lib/apt/lists", ignore_errors=True)
    (root / "var/lib/apt/lists/partial").mkdir(parents=True)
    for deb in (root / "var/cache/apt/archives").glob("*.deb"):
        deb.unlink()
    resolv = root / "etc/resolv.conf"
    if resolv.is_symlink():
        resolv.unlink()
    atomic_write(resolv, "# pdfleet lab: no DNS; lab names are in /etc/hosts\n")
    if not (root / "usr/sbin/sshd").exists() or not (root / "usr/bin/python3").exists():
        raise LabError(f"the image at {root} lacks sshd or python3; delete it and run lab.up again.")

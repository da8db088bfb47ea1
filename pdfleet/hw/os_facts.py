"""The host's operating system: /etc/os-release (os-release(5)), DGX OS's /etc/dgx-release, `uname -m` and
the DMI product name, in one command. `distro` turns it into the platform and its package plan.

Only the DGX keys the decisions read are printed: /etc/dgx-release also holds the serial number.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from pdfleet.hw.sections import split_sections
from pdfleet.ops.base import Fact

DGX_RELEASE = "/etc/dgx-release"
DGX_KEYS = ("DGX_NAME", "DGX_PRETTY_NAME", "DGX_SWBUILD_VERSION", "DGX_OTA_VERSION", "DGX_PLATFORM")
DMI_PRODUCT = "/sys/class/dmi/id/product_name"


@dataclass(frozen=True)
class OsRelease:
    """What a host runs: os-release ID, VERSION_ID, codename and pretty name; DGX OS's version when it is
    DGX OS; the machine architecture; the DMI product name (DGX platform tables key on it)."""

    id: str = ""
    version_id: str = ""
    codename: str = ""
    pretty_name: str = ""
    dgx_version: str | None = None  # DGX_OTA_VERSION, else DGX_SWBUILD_VERSION; None: not DGX OS
    dgx_name: str = ""
    arch: str = ""
    product_name: str = ""

    @property
    def dgx(self) -> bool:
        """DGX OS marks itself with /etc/dgx-release (DeepOps tests the same file)."""
        return self.dgx_version is not None

    def describe(self) -> str:
        """`Ubuntu 24.04.1 LTS (DGX OS 7.1.0, x86_64)`: what a refusal or a check says the host runs."""
        name = self.pretty_name or " ".join(p for p in (self.id, self.version_id) if p) or "an unknown OS"
        extra = [f"DGX OS {self.dgx_version}"] if self.dgx else []
        extra += [self.arch] if self.arch else []
        return f"{name} ({', '.join(extra)})" if extra else name


def parse_key_values(lines: list[str]) -> dict[str, str]:
    """KEY=value lines, shell-quoted values unquoted (os-release(5)); comments and junk skipped."""
    out: dict[str, str] = {}
    for line in lines:
        m = re.fullmatch(r"\s*([A-Z][A-Z0-9_]*)=(.*?)\s*", line)
        if not m:
            continue
        try:
            words = shlex.split(m[2])
        except ValueError:
            continue
        out[m[1]] = words[0] if words else ""
    return out


def parse_os(stdout: str) -> OsRelease:
    """The OsReleaseFact output sections: os-release, dgx-release, arch, product."""
    sec = split_sections(stdout)
    osr = parse_key_values(sec.get("os-release", []))
    dgx = parse_key_values(sec.get("dgx-release", []))
    dgx_version = dgx.get("DGX_OTA_VERSION") or dgx.get("DGX_SWBUILD_VERSION")
    if dgx and not dgx_version:
        dgx_version = ""  # the file exists without a version: still DGX OS
    first = {
        name: next((s.strip() for s in sec.get(name, []) if s.strip()), "") for name in ("arch", "product")
    }
    return OsRelease(
        id=osr.get("ID", "").lower(),
        version_id=osr.get("VERSION_ID", ""),
        codename=osr.get("VERSION_CODENAME") or osr.get("UBUNTU_CODENAME", ""),
        pretty_name=osr.get("PRETTY_NAME", ""),
        dgx_version=dgx_version,
        dgx_name=dgx.get("DGX_PRETTY_NAME") or dgx.get("DGX_NAME", ""),
        arch=first["arch"],
        product_name=first["product"],
    )


@dataclass(frozen=True)
class OsReleaseFact(Fact[OsRelease]):
    """The host's distribution, DGX OS marker, architecture and product name (one round trip)."""

    def command(self) -> str:
        keys = "|".join(k.removeprefix("DGX_") for k in DGX_KEYS)
        return (
            "echo '== os-release'; cat /etc/os-release 2>/dev/null || cat /usr/lib/os-release 2>/dev/null; "
            f"echo '== dgx-release'; grep -E '^DGX_({keys})=' {DGX_RELEASE} 2>/dev/null; "
            f"echo '== arch'; uname -m; echo '== product'; cat {DMI_PRODUCT} 2>/dev/null; true"
        )

    def parse(self, stdout: str, rc: int) -> OsRelease:
        return parse_os(stdout)

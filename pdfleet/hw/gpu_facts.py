"""GPU host facts: NVIDIA PCI functions, the NVIDIA driver, the running kernel, Secure Boot, MOK, nvidia-smi.

Commands never fail on a host without the hardware (or without the tool): they print what they
found, and the parsers turn "nothing" into an empty value, so the gpu_driver role can skip with a
reason. Parsers are module-level functions so the tests can feed them fixture text directly.
`gpu` turns these facts into decisions.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from pdfleet.hw.sections import split_sections
from pdfleet.ops.base import Fact

NVIDIA_VENDOR = "10de"
OPEN_LICENSE = "Dual MIT/GPL"  # `modinfo -F license nvidia` of the open kernel modules


# ---------------------------------------------------------------- PCI: GPUs and NVSwitches


@dataclass(frozen=True)
class PciDevice:
    """One PCI function: address, class code (4 hex digits), ids and the lspci name when known."""

    bdf: str
    class_code: str
    vendor: str
    device: str
    name: str = ""

    @property
    def is_gpu(self) -> bool:
        """Display class: 0302 3D controller (datacenter GPUs) or 0300 VGA (some PCIe cards)."""
        return self.class_code.startswith("03")

    @property
    def is_bridge_other(self) -> bool:
        """Class 0680 "bridge: other", which is how NVSwitches enumerate."""
        return self.class_code == "0680"


@dataclass(frozen=True)
class NvidiaPci:
    """NVIDIA functions on the PCI bus, split into GPUs and NVSwitches."""

    gpus: tuple[PciDevice, ...] = ()
    nvswitches: tuple[PciDevice, ...] = ()
    nvswitch_proc_devices: int = 0  # entries in /proc/driver/nvidia-nvswitch/devices (driver loaded)

    @property
    def has_nvswitch(self) -> bool:
        """NVSwitches seen on the bus or by the loaded nvswitch driver."""
        return bool(self.nvswitches) or self.nvswitch_proc_devices > 0


_LSPCI_NN = re.compile(
    r"^(?P<bdf>\S+) (?P<cls>.+?) \[(?P<code>[0-9a-f]{4})\]: (?P<name>.*) "
    r"\[(?P<vendor>[0-9a-f]{4}):(?P<device>[0-9a-f]{4})\](?: \(rev [0-9a-f]+\))?(?: \(prog-if .*\))?$"
)


def parse_lspci_nn(text: str) -> list[PciDevice]:
    """Lines of `lspci -Dnn` (pciutils: `BDF class [cccc]: name [vvvv:dddd] (rev rr)`)."""
    devices = []
    for line in text.splitlines():
        m = _LSPCI_NN.match(line.strip())
        if m:
            devices.append(PciDevice(m["bdf"], m["code"], m["vendor"], m["device"], m["name"].strip()))
    return devices


def parse_sysfs_pci(text: str) -> list[PciDevice]:
    """Lines `BDF 0xVVVV 0xDDDD 0xCCCCPP` read from /sys/bus/pci/devices/*/{vendor,device,class}."""
    devices = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 4:
            continue
        bdf, vendor, device, cls = parts
        devices.append(PciDevice(bdf, cls[2:6].lower(), vendor[2:].lower(), device[2:].lower()))
    return devices


def parse_nvidia_pci(stdout: str) -> NvidiaPci:
    """The NvidiaPciFact output: lspci (or sysfs when pciutils is absent) plus the nvswitch proc dir."""
    sec = split_sections(stdout)
    devices = parse_lspci_nn("\n".join(sec.get("lspci", [])))
    if not devices:
        devices = parse_sysfs_pci("\n".join(sec.get("sysfs", [])))
    nvidia = [d for d in devices if d.vendor == NVIDIA_VENDOR]
    gpus = tuple(d for d in nvidia if d.is_gpu)
    switches = tuple(d for d in nvidia if d.is_bridge_other)
    proc = [line for line in sec.get("nvswitch", []) if line.strip()]
    return NvidiaPci(gpus, switches, len(proc))


@dataclass(frozen=True)
class NvidiaPciFact(Fact[NvidiaPci]):
    """NVIDIA GPUs and NVSwitches on the PCI bus (DeepOps counts GPUs the same way, from lspci)."""

    def command(self) -> str:
        return (
            "echo '== lspci'; command -v lspci >/dev/null 2>&1 && lspci -Dnn -d 10de: 2>/dev/null; "
            "echo '== sysfs'; for d in /sys/bus/pci/devices/*; do [ -r \"$d/vendor\" ] || continue; "
            '[ "$(cat "$d/vendor")" = 0x10de ] && echo "${d##*/} $(cat "$d/vendor") '
            '$(cat "$d/device") $(cat "$d/class")"; done; '
            "echo '== nvswitch'; ls -1 /proc/driver/nvidia-nvswitch/devices 2>/dev/null; true"
        )

    def parse(self, stdout: str, rc: int) -> NvidiaPci:
        return parse_nvidia_pci(stdout)


# ---------------------------------------------------------------- driver, kernel, Secure Boot


@dataclass(frozen=True)
class DriverInfo:
    """The loaded NVIDIA kernel module (from /proc) and the installed one (from modinfo)."""

    loaded_version: str | None = None
    loaded_open: bool | None = None
    installed_version: str | None = None
    installed_license: str | None = None

    @property
    def installed_open(self) -> bool | None:
        """Whether the installed module is the open flavour (by its license); None when not installed."""
        if self.installed_license is None:
            return None
        return self.installed_license.strip() == OPEN_LICENSE

    @property
    def reboot_pending(self) -> bool:
        """Installed module differs from the loaded one: only a reboot (or module reload) fixes it."""
        return (
            self.loaded_version is not None
            and self.installed_version is not None
            and self.loaded_version != self.installed_version
        )


_NVRM = re.compile(r"^NVRM version: (?P<desc>.*?)\s+(?P<ver>\d+\.\d+(?:\.\d+)?)\s")


def parse_proc_nvidia_version(text: str) -> tuple[str | None, bool | None]:
    """/proc/driver/nvidia/version's NVRM line: the loaded version, and whether it is the open module."""
    for line in text.splitlines():
        m = _NVRM.match(line.strip() + " ")
        if m:
            return m["ver"], "Open Kernel Module" in m["desc"]
    return None, None


def parse_driver(stdout: str) -> DriverInfo:
    """The DriverFact output sections: proc, modinfo version, modinfo license."""
    sec = split_sections(stdout)
    loaded, loaded_open = parse_proc_nvidia_version("\n".join(sec.get("proc", [])))
    version = next((s.strip() for s in sec.get("version", []) if s.strip()), None)
    license_ = next((s.strip() for s in sec.get("license", []) if s.strip()), None)
    return DriverInfo(loaded, loaded_open, version, license_)


@dataclass(frozen=True)
class DriverFact(Fact[DriverInfo]):
    """Loaded and installed NVIDIA driver versions and flavour (open or proprietary).

    Which modules are loaded (nvidia_peermem, nouveau) is the generic LoadedModules fact's job."""

    def command(self) -> str:
        return (
            "echo '== proc'; cat /proc/driver/nvidia/version 2>/dev/null; "
            "echo '== version'; /sbin/modinfo -F version nvidia 2>/dev/null || modinfo -F version nvidia "
            "2>/dev/null; echo '== license'; /sbin/modinfo -F license nvidia 2>/dev/null || "
            "modinfo -F license nvidia 2>/dev/null; true"
        )

    def parse(self, stdout: str, rc: int) -> DriverInfo:
        return parse_driver(stdout)


@dataclass(frozen=True)
class KernelInfo:
    """The running kernel release and whether its headers (the DKMS build tree) are installed."""

    release: str
    headers_installed: bool

    @property
    def version(self) -> tuple[int, int]:
        """(major, minor) of the release, (0, 0) when unparsable."""
        m = re.match(r"(\d+)\.(\d+)", self.release)
        return (int(m[1]), int(m[2])) if m else (0, 0)

    @property
    def headers_package(self) -> str:
        """Debian/Ubuntu name headers after `uname -r` (e.g. linux-headers-6.1.0-18-amd64)."""
        return f"linux-headers-{self.release}"


def parse_kernel(stdout: str) -> KernelInfo:
    """`uname -r` then `headers=yes|no` (whether /lib/modules/$(uname -r)/build exists)."""
    lines = [s.strip() for s in stdout.splitlines() if s.strip()]
    release = lines[0] if lines else ""
    return KernelInfo(release, "headers=yes" in lines[1:])


@dataclass(frozen=True)
class KernelFact(Fact[KernelInfo]):
    """Running kernel and its headers: DKMS builds the driver against /lib/modules/$(uname -r)/build."""

    def command(self) -> str:
        return 'uname -r; [ -d "/lib/modules/$(uname -r)/build" ] && echo headers=yes || echo headers=no'

    def parse(self, stdout: str, rc: int) -> KernelInfo:
        return parse_kernel(stdout)


SB_ENABLED = "enabled"
SB_DISABLED = "disabled"
SB_UNSUPPORTED = "unsupported"  # legacy BIOS boot or no EFI variables: no signature enforcement
SB_UNKNOWN = "unknown"


def parse_secure_boot(stdout: str) -> str:
    """`mokutil --sb-state` (mokutil(1): "SecureBoot enabled|disabled"), or the efivar fallback."""
    text = stdout.strip()
    low = text.lower()
    if "secureboot enabled" in low:
        return SB_ENABLED
    if "secureboot disabled" in low:
        return SB_DISABLED
    if "not supported" in low or "doesn't support" in low or "no-efi" in low:
        return SB_UNSUPPORTED
    m = re.search(r"efivar (\d+)", low)
    if m:
        return SB_ENABLED if m[1] == "1" else SB_DISABLED
    return SB_UNKNOWN


@dataclass(frozen=True)
class SecureBootFact(Fact[str]):
    """Secure Boot state: with it on, unsigned DKMS modules (nvidia, peermem) refuse to load."""

    def command(self) -> str:
        var = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
        return (
            "if command -v mokutil >/dev/null 2>&1; then mokutil --sb-state 2>&1; "
            f"elif [ -r {var} ]; then echo \"efivar $(od -An -t u1 {var} | awk '{{print $NF}}')\"; "
            "elif [ -d /sys/firmware/efi ]; then echo unknown; else echo no-efi; fi; true"
        )

    def parse(self, stdout: str, rc: int) -> str:
        return parse_secure_boot(stdout)


def parse_mok_test_key(stdout: str) -> bool:
    """`mokutil --test-key CERT` prints "CERT is already enrolled" once the key is enrolled."""
    return "is already enrolled" in stdout


@dataclass(frozen=True)
class MokEnrolledFact(Fact[bool]):
    """Whether the DKMS signing certificate is enrolled as a MOK (DKMS then signs what it builds)."""

    cert: str = "/var/lib/dkms/mok.pub"

    def command(self) -> str:
        c = shlex.quote(self.cert)
        return f"[ -r {c} ] && command -v mokutil >/dev/null 2>&1 && mokutil --test-key {c} 2>&1; true"

    def parse(self, stdout: str, rc: int) -> bool:
        return parse_mok_test_key(stdout)


@dataclass(frozen=True)
class SmiGpu:
    """One nvidia-smi row."""

    index: int
    bus_id: str
    name: str
    driver_version: str
    persistence_mode: str  # "Enabled" / "Disabled"


def parse_nvidia_smi_csv(stdout: str) -> tuple[SmiGpu, ...]:
    """`nvidia-smi --query-gpu=index,pci.bus_id,name,driver_version,persistence_mode
    --format=csv,noheader` rows (comma+space separated, as nvidia-smi(1) documents)."""
    rows = []
    for line in stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 5 or not parts[0].isdigit():
            continue
        rows.append(SmiGpu(int(parts[0]), parts[1], parts[2], parts[3], parts[4]))
    return tuple(rows)


@dataclass(frozen=True)
class NvidiaSmiFact(Fact["tuple[SmiGpu, ...] | None"]):
    """Per-GPU rows from nvidia-smi; None when nvidia-smi is missing or cannot talk to the driver."""

    QUERY = "index,pci.bus_id,name,driver_version,persistence_mode"

    def command(self) -> str:
        return f"nvidia-smi --query-gpu={self.QUERY} --format=csv,noheader 2>/dev/null"

    def parse(self, stdout: str, rc: int) -> tuple[SmiGpu, ...] | None:
        return parse_nvidia_smi_csv(stdout) if rc == 0 else None

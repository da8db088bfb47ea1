"""base: the apt mirror (when the profile names one), common packages, the service user, pdfleet dirs.

It runs first on every host, so it refuses a host whose distribution pdfleet does not provision (the OS
fact, pdfleet.hw.distro) before any role changes anything there."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pdfleet.fleet.host_layout import CONFIG_DIR, SERVICE_USER, STATE_DIR
from pdfleet.fleet.render import RenderedFile
from pdfleet.fleet.roles import ManagedUnit, RoleContext
from pdfleet.hw import HardwareError
from pdfleet.hw.distro import PlatformRefusal, resolve_platform
from pdfleet.hw.os_facts import OsReleaseFact
from pdfleet.ops.apt import AptPackage, AptPackages, AptUpdate
from pdfleet.ops.base import Fact, FactSource, Operation, Skip
from pdfleet.ops.files import Directory, File
from pdfleet.ops.users import Group, User
from roles.base.defaults import APT_PACKAGES, MIRROR_LIST

NAME = "base"


def applies(ctx: RoleContext) -> bool:
    return True


def facts(ctx: RoleContext) -> tuple[Fact[Any], ...]:
    return (AptPackages(), OsReleaseFact())


def mirror_line(apt_mirror: str, trusted: bool) -> str:
    """A sources.list line: a bare URI is a flat repository (`URI ./`), else `URI SUITE COMPONENTS`."""
    spec = apt_mirror.strip()
    if " " not in spec:
        spec = f"{spec} ./"
    options = " [trusted=yes]" if trusted else ""
    return f"deb{options} {spec}\n"


def files(ctx: RoleContext) -> list[RenderedFile]:
    mirrors = ctx.profile.mirrors
    if not mirrors.apt:
        return []
    content = "# Managed by pdfleet: the site's apt mirror.\n" + mirror_line(mirrors.apt, mirrors.apt_trusted)
    return [RenderedFile(MIRROR_LIST, content)]


def units(ctx: RoleContext) -> list[ManagedUnit]:
    return []


def operations(ctx: RoleContext, facts: FactSource) -> Iterable[Operation | Skip]:
    """Refuse an unsupported distribution, then the mirror, packages, service user and directories."""
    try:
        resolve_platform(ctx.host.name, facts.get(OsReleaseFact()))
    except PlatformRefusal as exc:
        raise HardwareError(str(exc)) from None
    for rendered in files(ctx):
        yield File(rendered.path, rendered.content.encode(), mode=rendered.mode)
    installed = facts.get(AptPackages())
    if any(installed.get(p) is None for p in APT_PACKAGES):
        # Installing from lists older than the mirror's content fails; refresh only when installing.
        yield AptUpdate(max_age_minutes=0)
    for package in APT_PACKAGES:
        yield AptPackage(package)
    yield Group(SERVICE_USER, system=True)
    yield User(SERVICE_USER, group=SERVICE_USER, system=True, home=STATE_DIR, shell="/usr/sbin/nologin")
    # Units read env files as root before dropping privileges; the service user needs no access.
    yield Directory(CONFIG_DIR, mode="0755", owner="root", group="root")
    yield Directory(STATE_DIR, mode="0750", owner=SERVICE_USER, group=SERVICE_USER)

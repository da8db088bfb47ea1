"""base: the apt mirror (when the profile names one), common packages, the service user, pdfleet dirs."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pdfleet.fleet.host_layout import CONFIG_DIR, SERVICE_USER, STATE_DIR
from pdfleet.fleet.render import RenderedFile
from pdfleet.fleet.roles import ManagedUnit, RoleContext
from pdfleet.ops.apt import AptPackage, AptPackages, AptUpdate
from pdfleet.ops.base import Fact, FactSource, Operation, Skip
from pdfleet.ops.files import Directory, File
from pdfleet.ops.users import Group, User
from roles.base.defaults import APT_PACKAGES, MIRROR_LIST

NAME = "base"


def applies(ctx: RoleContext) -> bool:
    return True


def facts(ctx: RoleContext) -> tuple[Fact[Any], ...]:
    return (AptPackages(),)


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
    """The mirror, common packages, service user and directories (provision.plan_host has already refused a
    platform pdfleet does not provision)."""
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

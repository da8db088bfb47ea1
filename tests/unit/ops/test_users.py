"""Users and groups: getent/id facts on real outputs, Group and User plans."""

from __future__ import annotations

import pytest

from pdfleet.ops.base import FakeFacts
from pdfleet.ops.errors import FactError
from pdfleet.ops.users import (
    Group,
    GroupEntry,
    GroupInfo,
    PasswdEntry,
    User,
    UserGroups,
    UserInfo,
    parse_getent_group,
    parse_getent_passwd,
)
from tests.unit.ops.helpers import commands


def test_getent() -> None:
    assert parse_getent_passwd("pdfleet:x:998:998::/var/lib/pdfleet:/usr/sbin/nologin\n", 0) == PasswdEntry(
        "pdfleet", 998, 998, "", "/var/lib/pdfleet", "/usr/sbin/nologin"
    )
    assert parse_getent_passwd("", 2) is None
    assert parse_getent_group("video:x:44:pdfleet,ops\n", 0) == GroupEntry("video", 44, ("pdfleet", "ops"))
    assert parse_getent_group("sudo:x:27:\n", 0) == GroupEntry("sudo", 27, ())
    assert parse_getent_group("", 2) is None
    with pytest.raises(FactError):
        parse_getent_passwd("broken:line\n", 0)
    assert UserGroups("ops").parse("ops sudo video\n", 0) == frozenset({"ops", "sudo", "video"})
    assert UserGroups("nosuch").parse("", 1) is None


def test_group() -> None:
    assert Group("pdfleet").plan(FakeFacts({GroupInfo("pdfleet"): GroupEntry("pdfleet", 998, ())})) == []
    assert commands(Group("pdfleet").plan(FakeFacts({GroupInfo("pdfleet"): None}))) == [
        "groupadd --system pdfleet"
    ]


def test_user_created_with_group_from_same_run() -> None:
    op = User("pdfleet", group="pdfleet", home="/var/lib/pdfleet", groups=("video",))
    facts = FakeFacts({UserInfo("pdfleet"): None, GroupInfo("pdfleet"): None})
    assert commands(op.plan(facts)) == [
        "useradd --system --home-dir /var/lib/pdfleet --no-create-home --shell /usr/sbin/nologin "
        "--gid pdfleet --groups video pdfleet"
    ]
    own_group = User("svc").plan(FakeFacts({UserInfo("svc"): None, GroupInfo("svc"): None}))
    assert "--user-group" in str(commands(own_group)[0])


def test_user_converged_and_drift() -> None:
    op = User("pdfleet", group="pdfleet", home="/var/lib/pdfleet", groups=("video",))
    entry = PasswdEntry("pdfleet", 998, 998, "", "/var/lib/pdfleet", "/usr/sbin/nologin")
    base = {UserInfo("pdfleet"): entry, GroupInfo("pdfleet"): GroupEntry("pdfleet", 998, ())}
    assert op.plan(FakeFacts({**base, UserGroups("pdfleet"): frozenset({"pdfleet", "video"})})) == []
    drift = {**base, UserInfo("pdfleet"): PasswdEntry("pdfleet", 998, 998, "", "/home/p", "/bin/bash")}
    changes = op.plan(FakeFacts({**drift, UserGroups("pdfleet"): frozenset({"pdfleet"})}))
    assert commands(changes) == [
        "usermod --shell /usr/sbin/nologin --home /var/lib/pdfleet --append --groups video pdfleet"
    ]

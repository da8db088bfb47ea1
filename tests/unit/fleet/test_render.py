"""The review tree `invoke render` writes: each host's files under OUT/<host>/<absolute path>, with modes."""

from __future__ import annotations

import stat
from pathlib import Path

from pdfleet.fleet.render import RenderedFile, write_tree


def test_write_tree_puts_each_file_under_its_host_with_its_mode(tmp_path: Path) -> None:
    files = {"h1": [RenderedFile("/etc/pdfleet/a.env", "A=1\n", mode="0600")],
             "h2": [RenderedFile("/etc/systemd/system/b.service", "[Unit]\n")]}
    written = write_tree(files, tmp_path)
    assert written == [tmp_path / "h1/etc/pdfleet/a.env", tmp_path / "h2/etc/systemd/system/b.service"]
    assert (tmp_path / "h1/etc/pdfleet/a.env").read_text() == "A=1\n"
    assert stat.S_IMODE((tmp_path / "h1/etc/pdfleet/a.env").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "h2/etc/systemd/system/b.service").stat().st_mode) == 0o644

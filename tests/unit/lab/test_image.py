"""The cached debootstrap image: its key and its Debian mirror."""

from __future__ import annotations

from pathlib import Path

from pdfleet.lab.image import ImageRecipe, host_debian_mirror


def test_image_key_changes_with_the_package_list_only() -> None:
    a = ImageRecipe("bookworm", "http://deb.debian.org/debian", ("sudo", "curl"))
    assert a.key == ImageRecipe("bookworm", "http://deb.debian.org/debian", ("curl", "sudo")).key
    assert a.key != ImageRecipe("bookworm", "http://deb.debian.org/debian", ("curl", "sudo", "jq")).key


def test_debootstrap_uses_the_machines_debian_mirror(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n\n"
        "Types: deb\nURIs: http://mirror.example/debian/\nSuites: bookworm\n"
    )
    assert host_debian_mirror(tmp_path) == "http://mirror.example/debian"
    assert host_debian_mirror(tmp_path / "none") == "http://deb.debian.org/debian"

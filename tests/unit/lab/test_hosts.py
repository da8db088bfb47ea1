"""Files written into a lab host's overlay: its network and hosts files."""

from __future__ import annotations

from pathlib import Path

from pdfleet.lab.hosts import LabHost, dirs, hosts_file, login_evidence, network_file
from pdfleet.lab.paths import LabPaths


def test_network_file_is_static_with_no_gateway() -> None:
    text = network_file("198.18.0.21")
    assert "Name=host0" in text and "Address=198.18.0.21/24" in text
    assert "Gateway" not in text.replace("no gateway", "") and "DHCP=no" in text


def test_hosts_file_names_every_lab_host() -> None:
    text = hosts_file([LabHost("lab-gw", "198.18.0.10"), LabHost("lab-p1", "198.18.0.21")])
    assert "198.18.0.10\tlab-gw\n" in text and "198.18.0.21\tlab-p1\n" in text


def test_login_evidence_quotes_the_console_tail_of_a_stopped_host(tmp_path: Path) -> None:
    hd = dirs(LabPaths(tmp_path), "lab-x")
    hd.console_log.parent.mkdir(parents=True)
    hd.console_log.write_text("".join(f"boot line {i}\n" for i in range(30)))
    evidence = login_evidence(hd, None, lines=3)
    assert evidence == "console:\n  boot line 27\n  boot line 28\n  boot line 29"
    assert login_evidence(dirs(LabPaths(tmp_path), "lab-y"), None) == ""  # nothing known: nothing said

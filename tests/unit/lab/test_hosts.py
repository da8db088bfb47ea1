"""Files written into a lab host's overlay: its network and hosts files."""

from __future__ import annotations

from pdfleet.lab.hosts import LabHost, hosts_file, network_file


def test_network_file_is_static_with_no_gateway() -> None:
    text = network_file("198.18.0.21")
    assert "Name=host0" in text and "Address=198.18.0.21/24" in text
    assert "Gateway" not in text.replace("no gateway", "") and "DHCP=no" in text


def test_hosts_file_names_every_lab_host() -> None:
    text = hosts_file([LabHost("lab-gw", "198.18.0.10"), LabHost("lab-p1", "198.18.0.21")])
    assert "198.18.0.10\tlab-gw\n" in text and "198.18.0.21\tlab-p1\n" in text

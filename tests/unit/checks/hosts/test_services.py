"""verify's services checks read a host in one command per question: the listening ports from `ss -Hltn`,
the unit files and main processes' command lines from one loop over the units (outputs as a lab host gave
them)."""

from __future__ import annotations

import shlex

from pdfleet.checks.hosts.services import (
    CMDLINE_MARK,
    UNIT_MARK,
    key_leaks,
    listening_ports,
    parse_unit_dump,
    unit_dump_command,
)

SS = """LISTEN 0      128        0.0.0.0:22    0.0.0.0:*
LISTEN 0      128      127.0.0.1:8090  0.0.0.0:*
LISTEN 0      2048   198.18.0.10:8080  0.0.0.0:*
LISTEN 0      4096   198.18.0.10:9100  0.0.0.0:*
LISTEN 0      4096 127.0.0.53%lo:53    0.0.0.0:*
LISTEN 0      128           [::]:2222     [::]:*
"""

GATEWAY_CMDLINE = "/opt/pdfleet/gateway/bin/python /opt/pdfleet/gateway/bin/pdfleet-gateway --config p.yaml"
DUMP = f"""{UNIT_MARK}pdfleet-gateway.service
# /etc/systemd/system/pdfleet-gateway.service
[Service]
ExecStart=/opt/pdfleet/gateway/bin/pdfleet-gateway --config /etc/pdfleet/gateway/policy.yaml
{CMDLINE_MARK}
{GATEWAY_CMDLINE}{" "}
{UNIT_MARK}vllm-decode.service
[Service]
ExecStart=/opt/pdfleet/venv/bin/vllm serve m --api-key sk-lab-0123456789
{CMDLINE_MARK}
{UNIT_MARK}nope.service
{CMDLINE_MARK}
"""


def test_listening_ports_on_any_address() -> None:
    assert listening_ports(SS) == {22, 8090, 8080, 9100, 53, 2222}
    assert listening_ports("") == set()


def test_the_dump_parses_per_unit_and_a_missing_unit_is_empty() -> None:
    dumped = parse_unit_dump(DUMP)
    assert set(dumped) == {"pdfleet-gateway.service", "vllm-decode.service", "nope.service"}
    text, cmdline = dumped["pdfleet-gateway.service"]
    assert text.startswith("# /etc/systemd/system/pdfleet-gateway.service") and CMDLINE_MARK not in text
    assert cmdline == GATEWAY_CMDLINE
    assert dumped["vllm-decode.service"][1] == "" and dumped["nope.service"] == ("", "")


def test_leaks_name_the_unit_and_where() -> None:
    dumped = parse_unit_dump(DUMP)
    text, cmdline = dumped["vllm-decode.service"]
    assert key_leaks("vllm-decode.service", text, cmdline, ["sk-lab-0123456789"]) == [
        "vllm-decode.service unit file has --api-key",
        "vllm-decode.service unit file contains a key from an env file",
    ]
    gateway = dumped["pdfleet-gateway.service"]
    assert key_leaks("pdfleet-gateway.service", *gateway, ["sk-lab-0123456789"]) == []


def test_the_command_loops_over_quoted_names() -> None:
    """A name with shell characters stays one word (the lab's verify test runs the command on every host)."""
    command = unit_dump_command(["a.service", "b c;rm.service"])
    assert command.startswith(f"for u in a.service {shlex.quote('b c;rm.service')}; do ")

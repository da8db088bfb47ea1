"""The profile's `gateway.tls`: how clients and the rollout controller reach the gateway.

Either the site's PKI, three files on the control machine (provision pushes the certificate and key to
each gateway host, the key 0600 and owned by the service user; the CA to the gateway and monitoring
hosts, where the controller and the health probes verify the gateway against it), or the word `off`:
plain HTTP, which a profile must ask for and `invoke profiles` warns about.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

PLAIN = "off"
PLAIN_WARNING = (
    "the gateway listens in plain HTTP (gateway.tls: off): client and admin keys cross the network in "
    "clear; name the site's certificate, key and CA under gateway.tls"
)


class GatewayTls(BaseModel):
    """The site's PKI on the control machine (a leading ~ is the operator's home)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cert_file: str = Field(min_length=1)  # the gateway's certificate chain (PEM), leaf first
    key_file: str = Field(min_length=1)  # its private key (PEM, unencrypted, mode 0600 here)
    ca_file: str = Field(min_length=1)  # the CA that signed it: what clients verify against
    # `invoke verify` warns when the certificate lapses within this many days
    warn_days: int = Field(21, ge=1, le=365)


def _off_word(value: object) -> object:
    """YAML 1.1 reads a bare `off` as false: both spell plain HTTP."""
    return PLAIN if value is False else value


GatewayTlsSetting = Annotated[GatewayTls | Literal["off"], BeforeValidator(_off_word)]


def tls_warnings(setting: GatewayTlsSetting) -> list[str]:
    """What `invoke profiles` says about a profile's TLS setting: plain HTTP is warned about."""
    return [PLAIN_WARNING] if setting == PLAIN else []

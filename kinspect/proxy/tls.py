"""TLS towards clients and towards brokers, from paths in the config (ssl module)."""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass

log = logging.getLogger("kinspect.proxy")


@dataclass
class TlsConfig:
    enabled: bool = False
    ca_file: str | None = None  # CA bundle to verify the peer (default: the system's)
    cert_file: str | None = None  # our certificate (required towards clients)
    key_file: str | None = None
    verify: bool = True  # verify the peer's certificate (brokers: on by default)
    server_hostname: str | None = None  # name to check in the broker's certificate (default: its host)


def client_side_context(config: TlsConfig) -> ssl.SSLContext | None:
    """The context kinspect's listeners use to accept TLS from clients."""
    if not config.enabled:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(config.cert_file, config.key_file)
    if config.ca_file:  # clients must then present a certificate signed by this CA (mutual TLS)
        context.load_verify_locations(config.ca_file)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def broker_side_context(config: TlsConfig) -> ssl.SSLContext | None:
    """The context kinspect uses to connect to brokers over TLS; verification on by default."""
    if not config.enabled:
        return None
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=config.ca_file)
    if config.cert_file:
        context.load_cert_chain(config.cert_file, config.key_file)
    if not config.verify:
        log.warning("TLS certificate verification towards brokers is DISABLED (tls.broker.verify = false)")
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context

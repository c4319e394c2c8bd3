"""TLS towards clients and towards brokers, from paths in the config (ssl module)."""

from __future__ import annotations

import logging
import ssl

from kinspect.config import TlsConfig

log = logging.getLogger("kinspect.proxy")


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

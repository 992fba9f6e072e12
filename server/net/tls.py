"""TLS and who may listen without it: a token is required off loopback, unless
``--insecure`` says otherwise (see ``Server.start``)."""

from __future__ import annotations

import ipaddress
import ssl

from tidal.server.config import Config
from tidal.server.errors import BadSettings


def tls_context(config: Config) -> ssl.SSLContext | None:
    if not (config.tls_cert or config.tls_key):
        return None
    if not (config.tls_cert and config.tls_key):
        raise BadSettings("TLS needs both --tls-cert and --tls-key")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(config.tls_cert, config.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise BadSettings(
            f"--tls-cert {config.tls_cert} / --tls-key {config.tls_key}: cannot load them:"
            f" {getattr(exc, 'strerror', None) or exc}"
        ) from None
    return context


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name that might resolve anywhere

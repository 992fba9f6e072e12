"""TLS and who may listen without a token: one is required off loopback, on either port,
unless ``--insecure`` says otherwise (``protect``, at ``Server.start``)."""

from __future__ import annotations

import ipaddress
import ssl

from tidal.server import kinds
from tidal.server.config import Config
from tidal.server.errors import BadSettings, ProtectedMode


def protect(config: Config) -> None:
    """Refuse to listen beyond loopback, on either port, without a token (unless
    ``--insecure``): anyone who could reach it could change who has left."""
    http = None if config.http is None else kinds.split(config.http)[0]
    exposed = next((h for h in (config.host, http) if h is not None and not is_loopback(h)), None)
    if exposed is not None and not (config.token or config.insecure):
        raise ProtectedMode(
            f"refusing to listen on {exposed!r} without a token: anyone who can reach it"
            " could change who has left. Set --token (or TIDAL_TOKEN), or pass --insecure"
            " if the network in front of it is trusted."
        )


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

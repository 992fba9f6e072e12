"""How a face connects, declared once: the options all four faces take, with their
defaults (``Client.connect``, ``ClusterClient.connect``, ``SyncClient``,
``SyncClusterClient``)."""

from __future__ import annotations

import ssl as ssl_module
from dataclasses import dataclass
from typing import Final, TypedDict

#: seconds a connect, and by default each call, may take
DEFAULT_TIMEOUT: Final = 30.0


class ConnectOptions(TypedDict, total=False):
    """``timeout`` bounds the connect and is each call's default (None: no limit).
    With ``token``, the connection authenticates first (``Unauthorized`` if refused).
    With ``ssl`` (e.g. ``ssl.create_default_context(cafile=...)``), it speaks TLS.
    With ``auto_keys``, every signal gets an idempotency key, so that every signal in
    flight when a connection drops is retried safely."""

    timeout: float | None
    token: str | None
    ssl: ssl_module.SSLContext | None
    auto_keys: bool


@dataclass(frozen=True, slots=True)
class Connecting:
    """``ConnectOptions`` with their defaults; an unknown one is a ``TypeError``, as a
    keyword argument a function does not take is."""

    timeout: float | None = DEFAULT_TIMEOUT
    token: str | None = None
    ssl: ssl_module.SSLContext | None = None
    auto_keys: bool = False

    def options(self) -> ConnectOptions:
        """All of them, to connect another face (a cluster's node) alike."""
        return ConnectOptions(
            timeout=self.timeout, token=self.token, ssl=self.ssl, auto_keys=self.auto_keys
        )

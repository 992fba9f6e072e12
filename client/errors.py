"""What a call can raise: all of it under ``TidalError``, so one ``except`` catches
every failure of a call. The server's answers are the protocol's classes, one per wire
error code (``tidal.protocol.refusals``), written once for the server and the client;
here are the client's own: a call not sent, a connection lost, no reply in time."""

from __future__ import annotations

from typing import Any

from tidal.protocol import ErrorCode, LocalProtocolError
from tidal.protocol.refusals import (
    FeedGap,
    InternalError,
    InvalidParams,
    InvalidRequest,
    MethodNotFound,
    Moved,
    ParseError,
    ServerError,
    TidalError,
    TooLarge,
    Unauthorized,
    Unavailable,
    from_wire,
)

__all__ = [
    "CallTimeout",
    "ClientError",
    "ConnectFailed",
    "ConnectionLost",
    "FeedGap",
    "InternalError",
    "InvalidArgument",
    "InvalidParams",
    "InvalidRequest",
    "MethodNotFound",
    "Moved",
    "ParseError",
    "RequestTooLarge",
    "ServerError",
    "TidalError",
    "TooLarge",
    "Unauthorized",
    "Unavailable",
    "closed_by_server",
    "from_wire",
    "unsendable",
]


class ClientError(TidalError):
    """The call was not sent: its arguments cannot go on the wire. Nothing reached the server."""


class InvalidArgument(ClientError, ValueError):
    """An argument MessagePack cannot carry, or outside what tidal accepts (a user id of 2**64)."""


class RequestTooLarge(ClientError):
    """The encoded request is larger than the message size limit."""


class ConnectionLost(TidalError, ConnectionError):
    """The connection dropped (or was closed) before the reply came.

    A write sent before the drop may or may not have been applied.
    """


class ConnectFailed(ConnectionLost):
    """No connection could be made (refused, unreachable, TLS handshake failed)."""


class CallTimeout(TidalError, TimeoutError):
    """No reply within the call's timeout; a write may still be applied by the server."""


def unsendable(exc: LocalProtocolError) -> ClientError:
    """The client's error for a request the protocol refused to encode."""
    if exc.code == ErrorCode.TOO_LARGE:
        return RequestTooLarge(str(exc))
    return InvalidArgument(str(exc))


def closed_by_server(params: Any) -> ConnectionLost:
    """The server's ``error`` notification: why it is closing this connection."""
    if type(params) is list and params:
        error = from_wire(params[0] if len(params) == 1 else params)
        return ConnectionLost(f"closed by the server: {error}")
    return ConnectionLost(f"closed by the server: {params!r}")

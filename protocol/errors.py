"""Error codes on the wire and the two ways a protocol can be broken.

The split follows h11: a ``LocalProtocolError`` means *we* asked for something
the protocol cannot express (a bug on our side), a ``RemoteProtocolError`` means
the peer sent something we cannot make sense of (the connection must go).
"""

from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    """The ``code`` of an error ``[code, message]``; JSON-RPC's numbers where they fit."""

    PARSE_ERROR = -32700
    INVALID_REQUEST = -32600
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602
    INTERNAL_ERROR = -32603
    UNAUTHORIZED = 1
    UNAVAILABLE = 2
    TOO_LARGE = 3
    MOVED = 4


class ProtocolError(Exception):
    """Base of both protocol errors; ``code`` is what a reply to it would carry."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.INVALID_REQUEST) -> None:
        super().__init__(message)
        self.code = code


class LocalProtocolError(ProtocolError):
    """We tried to send something MessagePack-RPC cannot carry."""


class RemoteProtocolError(ProtocolError):
    """The peer broke the stream; nothing more can be read from it.

    ``msgid`` is set when the offending request could still be identified, so
    that the peer can be told why before the connection is closed.
    """

    def __init__(
        self,
        message: str,
        code: ErrorCode = ErrorCode.INVALID_REQUEST,
        msgid: int | None = None,
    ) -> None:
        super().__init__(message, code)
        self.msgid = msgid

"""Error codes on the wire and the two ways a protocol can be broken.

The split follows h11: a ``LocalProtocolError`` means *we* asked for something
the protocol cannot express (a bug on our side), a ``RemoteProtocolError`` means
the peer sent something we cannot make sense of (the connection must go).
"""

from __future__ import annotations

import re
from enum import IntEnum
from typing import Any, Final


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


#: An error's message is cut past this many characters, saying how long it was: what a
#: peer sent is quoted in it, and a megabyte's name must not come back as four.
MESSAGE_MOST: Final = 1000


def quoted(value: str | bytes, most: int = 100) -> str:
    """Input as an error quotes it: escaped (``repr``), its first ``most`` characters, and
    how long it was when it was longer."""
    shown = repr(value[:most])
    n = most
    while len(shown) > most + 3:  # escapes count: a NUL is shown as four characters
        n = n * most // len(shown)
        shown = repr(value[:n])
    if n >= len(value):
        return shown
    unit = "bytes" if isinstance(value, bytes) else "characters"
    return f"{shown}... ({len(value)} {unit})"


def bounded(message: str) -> str:
    """An error's message, cut to ``MESSAGE_MOST`` characters if longer."""
    if len(message) <= MESSAGE_MOST:
        return message
    return f"{message[:MESSAGE_MOST]}... (cut: {len(message)} characters)"


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


#: error 2's kinds besides ``unavailable`` (storage failed or away): its message begins
#: with the kind and a colon. What a client does next: ask again shortly (``starting``,
#: ``retry``), go to another address (``standby``, ``stopping``), or make room (``full``)
UNAVAILABLE_KINDS: Final = ("starting", "standby", "retry", "full", "stopping")
_MOVED: Final = re.compile(r"moved: (?:user (\d+) is in partition (\d+), )?.*served by (\S+)$")
_OLDEST: Final = re.compile(r"the oldest kept is (\d+)")
_LOST: Final = re.compile(r"^group (?:'.*'|\".*\") lost events (\d+)\.\.(\d+):")


def error_data(code: int, message: str) -> dict[str, Any]:
    """The structured data of an error, the third element of ``[code, message, data]``
    (PROTOCOL.md), so that no client reads it from the message: error 2's ``kind``;
    ``moved``'s ``owner`` (``host:port``, or nil while no node serves the partition), with
    ``user_id`` and ``partition`` where one user was refused; a lost feed cursor's
    ``oldest`` kept event id; the range of events a consumer group ``lost``. Every such
    message is written by tidal in one form, which this reads."""
    if code == ErrorCode.UNAVAILABLE:
        head = message.split(":", 1)[0]
        return {"kind": head if head in UNAVAILABLE_KINDS else "unavailable"}
    if code == ErrorCode.MOVED and (moved := _MOVED.match(message)) is not None:
        user, part, owner = moved.groups()
        data: dict[str, Any] = {"owner": None if owner == "unknown" else owner}
        if user is not None:
            data.update(user_id=int(user), partition=int(part))
        return data
    if code == ErrorCode.INVALID_PARAMS and (oldest := _OLDEST.search(message)) is not None:
        return {"oldest": int(oldest[1])}
    if code == ErrorCode.INVALID_PARAMS and (lost := _LOST.match(message)) is not None:
        return {"lost": [int(lost[1]), int(lost[2])]}
    return {}

"""What the framing (``framing``) hands back besides a message: that it needs more
bytes, that it decoded part of a large one, or that a whole one cannot be read; and the
msgid read from a refused message's first bytes, to tell the sender which it was.
"""

from __future__ import annotations

from typing import Final, NamedTuple

import msgpack

from .messages import REQUEST


class _NeedData:
    """Sentinel type: the buffer holds no complete message yet."""

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = _NeedData()


class _Decoding:
    """Sentinel type: part of a large message was decoded; call ``next_event`` again."""

    def __repr__(self) -> str:
        return "DECODING"


DECODING: Final = _Decoding()


class Unreadable(NamedTuple):
    """A whole message that cannot be made into objects (a map key that is an array or a
    map: Python cannot hash it). Its frame was found, so the stream goes on after it; a
    request's msgid, when its first bytes hold one, is told why."""

    msgid: int | None
    message: str


#: what the peer is told of a map key that cannot be one
UNHASHABLE_KEY: Final = (
    "a map key must be a string, bin, integer, float, boolean or nil; an array or a map"
    " cannot be one"
)


def peek_msgid(head: bytes) -> int | None:
    """The msgid of a request from the first bytes of its encoding, if they hold it.

    Used when a message is too large to buffer: its header is all we have, and
    it is enough to tell the sender which request was refused.
    """
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=len(head) or 1)
    unpacker.feed(head)
    try:
        if unpacker.read_array_header() != 4 or unpacker.unpack() != REQUEST:
            return None
        msgid = unpacker.unpack()
    except Exception:
        return None
    return msgid if type(msgid) is int else None  # bool is no msgid

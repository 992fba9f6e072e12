"""Replies into bytes: all of a flush in one message stream, and any reply that cannot
be encoded, or is over the message limit a peer could read, replaced by an error
that says so (the others still go)."""

from __future__ import annotations

import logging
from typing import Any

from tidal.protocol import RESPONSE, Connection, ErrorCode, LocalProtocolError

log = logging.getLogger("tidal.connection")


def encode(conn: Connection, replies: list[list[Any]]) -> bytes:
    try:
        data = conn.send_responses(replies)
    except LocalProtocolError:
        return _each(conn, replies)
    if len(data) > conn.max_message_size:
        return _each(conn, replies)  # one of them may be over the limit alone
    return data


def _each(conn: Connection, replies: list[list[Any]]) -> bytes:
    parts = []
    limit = conn.max_message_size
    for reply in replies:
        try:
            part = conn.send_responses([reply])
        except LocalProtocolError:
            log.exception("cannot encode the reply to %d", reply[1])
            error = [int(ErrorCode.INTERNAL_ERROR), "the result could not be encoded", {}]
            part = conn.send_responses([[RESPONSE, reply[1], error, None]])
        if len(part) > limit:
            log.error("the reply to %d is %d bytes, over the limit", reply[1], len(part))
            message = f"the result is {len(part)} bytes, over the message limit of {limit}"
            error = [int(ErrorCode.TOO_LARGE), message, {}]
            part = conn.send_responses([[RESPONSE, reply[1], error, None]])
        parts.append(part)
    return b"".join(parts)

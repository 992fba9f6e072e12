"""A batch's replies on their way out: each answered once its commit is done, or refused
with it, and every connection touched flushed once."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from tidal.protocol import ErrorCode
from tidal.protocol.refusals import ServerError
from tidal.server.core.batch import Batch
from tidal.server.core.replies import NOTHING_SAVED, UNKNOWN_SAVED, Later, Replier
from tidal.server.errors import StorageFailure

from .room import ReplyRoom

log = logging.getLogger("tidal.engine")


def deliver(room: ReplyRoom, batch: Batch) -> None:
    """The replies of a committed batch. A read's is written out as soon as it is made,
    and let go of: what waited for the batch is built one reply at a time, not all at once
    (``room``)."""
    touched: dict[Replier, None] = {}
    for conn, msgid, result in batch.replies:
        if isinstance(result, Later):
            answer(conn, msgid, result.answer)
            if result.is_read:
                conn.flush()
                room.give(conn, result)
        else:
            conn.reply(msgid, result)
        touched[conn] = None
    for conn in touched:
        conn.flush()


def refuse(
    room: ReplyRoom,
    batches: tuple[Batch, ...],
    message: str,
    code: ErrorCode = ErrorCode.UNAVAILABLE,
) -> None:
    """Error 2 (or ``code``) for every reply that depended on ``batches``; a report
    (health) is answered as things now are."""
    touched: dict[Replier, None] = {}
    for failed in batches:
        for conn, msgid, result in failed.replies:
            if isinstance(result, Later):
                if result.is_read:
                    room.give(conn, result)
                if result.survives_failure:
                    answer(conn, msgid, result.answer)
                    touched[conn] = None
                    continue
                text = result.refused(message, batches)
                # part of it was saved (a leave before its purge): never "moved", which says
                # nothing was, and which a routing client follows by sending it again
                conn.reply_error(msgid, code if text == message else ErrorCode.UNAVAILABLE, text)
            else:
                conn.reply_error(msgid, code, message)
            touched[conn] = None
    for conn in touched:
        conn.flush()


def answer(conn: Replier, msgid: int | None, work: Callable[[], Any]) -> None:
    """A reply worked out now. Whatever goes wrong in working it out is that request's
    error (-32603), never the writer's or the reader's: they go on for everyone else."""
    try:
        result = work()
    except ServerError as exc:  # a refusal known only once the batch committed
        conn.reply_error(msgid, exc.code, exc.message)
    except Exception:
        log.exception("internal error while answering msgid %s", msgid)
        conn.reply_error(msgid, ErrorCode.INTERNAL_ERROR, "internal error in this reply")
    else:
        conn.reply(msgid, result)


def refusal(exc: StorageFailure) -> str:
    """What the requests of a batch that ``exc`` refused are told: that nothing of them was
    saved, or (its COMMIT cut off, its outcome not found out) that it is unknown."""
    if exc.data:
        return (
            f"storage unavailable: the database refused a value in this request's group"
            f" commit ({exc}); {NOTHING_SAVED}"
        )
    if exc.outcome_unknown:
        return f"storage unavailable: {exc}; {UNKNOWN_SAVED}"
    return f"storage unavailable: {exc}; {NOTHING_SAVED}"

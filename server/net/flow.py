"""Flow control for one connection: reading, and applying what was read, stop for any
of a few reasons, each set and cleared on its own (as uvicorn's FlowControl, with more
reasons than a paused transport)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final


class FlowControl:
    """Reading, and applying what was read, stop for any of a few reasons and go on only
    once none is left. Each reason is set and cleared on its own, so that one passing
    never resumes a connection another still holds."""

    BUSY: Final = 1  # too many requests awaiting replies (--max-inflight)
    BLOCKED: Final = 2  # the peer does not read its replies: the transport's buffer is full
    HELD: Final = 4  # the engine holds all the work it may until a commit ends (every connection)
    YIELDED: Final = 8  # this connection had its slice of the loop; others go first
    READS: Final = 16  # too many large reads (counts) awaiting replies
    DRAINING: Final = 32  # shutting down: nothing more is taken on
    #: a read waits for a purge or erase read before it to take effect: what the connection
    #: sent after it waits too, so that the read answers as of its place in that order
    DEFERRED: Final = 64

    def __init__(self, transport: asyncio.Transport, resume: Callable[[], None]) -> None:
        self._transport = transport
        self._resume = resume
        self.stopped = 0  # the reasons set now

    def set(self, reason: int, on: bool) -> None:
        was = self.stopped
        now = was | reason if on else was & ~reason
        if now == was:
            return
        self.stopped = now
        if self._transport.is_closing():
            return
        if not now:
            self._transport.resume_reading()
            self._resume()
        elif not was:
            self._transport.pause_reading()

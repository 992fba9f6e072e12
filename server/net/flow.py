"""Flow control for one connection: reading, and applying what was read, stop for any
of a few reasons, each set and cleared on its own (as uvicorn's FlowControl, with more
reasons than a paused transport)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

#: Large reads (``counts``) one connection may have awaiting replies.
MAX_PENDING_READS: Final = 16


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


class Allowance:
    """A connection's output allowance (--max-output-buffer): only a few reads may wait
    at once for their replies, and what those may take, with what is still unsent,
    counts against it. Past it, nothing more is applied (``FlowControl.READS``) until
    replies are written out and read."""

    def __init__(self, flow: FlowControl, transport: asyncio.Transport, most: int) -> None:
        self._flow = flow
        self._transport = transport
        self._most = most
        self._reads = 0  # reads awaiting their batch
        self._reserved = 0  # ... and the most bytes their replies may take

    def reading(self, bytes_: int) -> None:
        """A read whose reply may take ``bytes_`` began (> 0) or was answered (< 0)."""
        self._reads += 1 if bytes_ > 0 else -1
        self._reserved += bytes_
        self.judge()

    def judge(self) -> None:
        full = self._reserved + self._transport.get_write_buffer_size()
        self._flow.set(FlowControl.READS, self._reads >= MAX_PENDING_READS or full >= self._most)

"""The shapes a reply takes on its way out, kept apart so that every room can name
them: where an answer goes (``Replier``, the connection), an answer worked out
after its commit (``Later``), how to take back a change to memory (``Undo``), and
what a connection tells its subscription (``Listener``).
"""

from __future__ import annotations

from typing import Any, Final, Protocol

from tidal.protocol.refusals import Unavailable

#: how a refusal of a write ends when its batch was refused: the client may send it again
NOTHING_SAVED: Final = "nothing of this request was saved"
#: ... when its batch's COMMIT may have held: the client finds out by reading
UNKNOWN_SAVED: Final = "whether this request was saved is unknown"


class Undo(Protocol):
    """How to put back one change to memory that a batch carried, should its commit fail.
    Each part of the state (leave state, cohorts, idempotency keys) makes its own."""

    def undo(self) -> None: ...


#: What a reply takes in memory while it is built, per byte it takes on the wire, at most:
#: a page of 5,000 left users is 95 KB of MessagePack and 1.3 MB of Python objects (its rows,
#: then its answer), as measured with tracemalloc. A read waiting for its batch holds this
#: much of the memory budget (``ReplyRoom``).
BUILD_FACTOR: Final = 14


class Later:
    """A reply worked out only once its batch is done (a read of the table, a health check).
    ``survives_failure``: answered even if the commit failed (it reports, not reveals).
    ``is_read``: a read, counted among the few a connection may have waiting, and ``bound()``
    the most bytes its reply may take on the wire: what the connection and the memory budget
    hold for it until it is written."""

    survives_failure = False
    is_read = True

    def bound(self) -> int:
        return 1024

    def answer(self) -> Any:
        raise NotImplementedError

    def refused(self, message: str, batches: tuple[Any, ...]) -> str:
        """The error it gets when ``batches`` (its own among them) are refused: ``message``,
        unless part of the request was written in an earlier batch (``changes.Outcome``)."""
        return message


class Refusal(Later):
    """Error 2, sent once the batch it waits on has committed: a refusal that says what of
    the request that batch saved (refused with the batch, if it is)."""

    is_read = False

    def __init__(self, message: str) -> None:
        self.message = message

    def answer(self) -> Any:
        raise Unavailable(self.message)


class Replier(Protocol):
    """Where an answer goes: the server's connection. Every request and notification it
    hands on gets exactly one ``reply`` or ``reply_error``; a notification's (msgid None)
    only ends its place in flight."""

    def reply(self, msgid: int | None, result: Any) -> None: ...

    def reply_error(self, msgid: int | None, code: int, message: str) -> None: ...

    def reading(self, bytes_: int) -> None:
        """A read whose reply may take ``bytes_`` began (> 0), or was answered (< 0)."""

    def hold(self, on: bool) -> None: ...

    def flush(self) -> None: ...

    # -- what the change feed pushes through (``engine.publisher``) ------------------------

    #: told when the connection can take more, and when it is gone
    listener: Listener | None

    def push(self, data: bytes) -> None:
        """Bytes the server sends unasked (notifications), after every reply made so far."""

    def unsent(self) -> int:
        """Bytes written to the connection that the peer has not yet taken."""

    def blocked(self) -> bool:
        """The transport holds more than it wants to: the peer reads slower than we write."""

    def end(self, data: bytes) -> None:
        """Send ``data`` last, then close (the peer may still read what was sent)."""


class Listener(Protocol):
    def writable(self) -> None:
        """The connection's transport has drained below its low-water mark."""

    def lost(self) -> None:
        """The connection is closed."""

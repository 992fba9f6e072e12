"""The shapes a reply takes on its way out, kept apart so that every room can name
them: where an answer goes (``Replier``, the connection), an answer worked out
after its commit (``Later``), and how to take back a change to memory (``Undo``).
"""

from __future__ import annotations

from typing import Any, Protocol


class Undo(Protocol):
    """How to put back one change to memory that a batch carried, should its commit fail.
    Each part of the state (leave state, cohorts, idempotency keys) makes its own."""

    def undo(self) -> None: ...


class Later:
    """A reply worked out only once its batch is done (a read of the table, a health check).
    ``survives_failure``: answered even if the commit failed (it reports, not reveals).
    ``is_read``: a read, counted among the few a connection may have waiting."""

    survives_failure = False
    is_read = True

    def answer(self) -> Any:
        raise NotImplementedError


class Replier(Protocol):
    """Where an answer goes: the server's connection. Every request and notification it
    hands on gets exactly one ``reply`` or ``reply_error``; a notification's (msgid None)
    only ends its place in flight."""

    def reply(self, msgid: int | None, result: Any) -> None: ...

    def reply_error(self, msgid: int | None, code: int, message: str) -> None: ...

    def reading(self, started: bool) -> None: ...

    def flush(self) -> None: ...

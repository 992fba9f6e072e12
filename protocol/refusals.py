"""Every way a server refuses a request, one class per wire code, written once: the
server raises one in a handler and answers ``[code, message, data]``; the client raises
the one a reply carries (``from_wire``), under the same ``TidalError`` as its own errors,
so that one ``except`` catches every failure of a call.

``message`` is what goes on the wire. ``str()`` of one reads ``[code] message``, as a
client prints it; the server answers with ``message``, never with ``str()``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from .errors import ErrorCode, error_data


class TidalError(Exception):
    """Base of every error tidal raises: the server's own, and the client's."""


class ServerError(TidalError):
    """A request refused: ``[code, message, data]`` on the wire. ``data`` is a map
    (PROTOCOL.md says what each code's holds; empty from a server without it)."""

    code: ClassVar[int] = 0

    def __init__(
        self, message: str, code: int | None = None, data: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.data: dict[str, Any] = data if data is not None else {}
        if code is not None:
            self.code = code  # type: ignore[misc]

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


def said(exc: BaseException) -> str:
    """What an exception says in a message: a refusal's own words, anything else's text."""
    return exc.message if isinstance(exc, ServerError) else str(exc)


class ParseError(ServerError):
    code = ErrorCode.PARSE_ERROR


class InvalidRequest(ServerError):
    code = ErrorCode.INVALID_REQUEST


class MethodNotFound(ServerError):
    code = ErrorCode.METHOD_NOT_FOUND


class InvalidParams(ServerError):
    """A parameter broke its rule; the message names it and the rule."""

    code = ErrorCode.INVALID_PARAMS


class FeedGap(InvalidParams):
    """The change feed no longer keeps the events after the id a subscription resumes
    from (``--event-retention``): whatever was built from it must be rebuilt from the
    current state, then followed from a new subscription. ``oldest``: the oldest kept."""

    def __init__(self, message: str, oldest: int | None = None) -> None:
        super().__init__(message, data={"oldest": oldest})
        self.oldest = oldest


class InternalError(ServerError):
    code = ErrorCode.INTERNAL_ERROR


class Unauthorized(ServerError):
    code = ErrorCode.UNAUTHORIZED


class Unavailable(ServerError):
    """Storage failed on the server: the write was not saved. Or the server is still
    loading its database (``starting``): nothing was applied, and the clients ask again."""

    code = ErrorCode.UNAVAILABLE

    @property
    def kind(self) -> str:
        """``starting``, ``standby``, ``retry``, ``full``, ``stopping`` or ``unavailable``:
        the error's ``data.kind`` (PROTOCOL.md)."""
        kind = self.data.get("kind")
        return kind if isinstance(kind, str) else error_data(self.code, self.message)["kind"]

    @property
    def starting(self) -> bool:
        """The server is still loading its database (or a partition): nothing was applied."""
        return self.kind == "starting"

    @property
    def standby(self) -> bool:
        """The server waits to take over from another and applied nothing: a client given
        several addresses goes to another."""
        return self.kind == "standby"

    @property
    def retry(self) -> bool:
        """Nothing was applied, for a passing reason (cluster mode: another node changed the
        cohorts as this request's were matched): the clients send it again."""
        return self.kind == "retry"

    @property
    def full(self) -> bool:
        """The write would have created aggregates past the server's memory budget, and
        nothing of it was applied; writes to aggregates it holds, and every other request,
        go on. Sending it again helps only once a purge, an erasure or an operator made
        room."""
        return self.kind == "full"


class TooLarge(ServerError):
    code = ErrorCode.TOO_LARGE


class Moved(ServerError):
    """The user's partition is served by another node of the cluster: nothing was applied.
    ``address`` is the node that serves it, as ``host:port``, or None while no node does
    (docs/PROTOCOL.md)."""

    code = ErrorCode.MOVED

    @property
    def address(self) -> str | None:
        owner = (self.data or error_data(self.code, self.message)).get("owner")
        return owner if isinstance(owner, str) else None


BY_CODE: dict[int, type[ServerError]] = {
    cls.code: cls
    for cls in (
        ParseError,
        InvalidRequest,
        MethodNotFound,
        InvalidParams,
        InternalError,
        Unauthorized,
        Unavailable,
        TooLarge,
        Moved,
    )
}


def from_wire(error: Any) -> ServerError:
    """The exception for a response's error field, whatever shape a server sent."""
    if type(error) is list and len(error) in (2, 3) and type(error[0]) is int:
        code, message = error[:2]
        data = error[2] if len(error) == 3 and type(error[2]) is dict else {}
        cls = BY_CODE.get(code, ServerError)
        exc = cls(str(message), None if cls is not ServerError else code)
        exc.data = data
        if cls is InvalidParams and "oldest" in data:  # a change feed cursor lost
            return FeedGap(str(message), data["oldest"])
        return exc
    return ServerError(repr(error))

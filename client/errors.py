"""What a call can raise: all of it under ``TidalError``, so one ``except`` catches
every failure of a call; one class per wire error code for the server's answers."""

from __future__ import annotations

from typing import Any, ClassVar

from tidal.protocol import ErrorCode, LocalProtocolError, error_data


class TidalError(Exception):
    """Base of every error the client raises."""


class ClientError(TidalError):
    """The call was not sent: its arguments cannot go on the wire. Nothing reached the server."""


class InvalidArgument(ClientError, ValueError):
    """An argument MessagePack cannot carry, or outside what tidal accepts (a user id of 2**64)."""


class RequestTooLarge(ClientError):
    """The encoded request is larger than the message size limit."""


class ConnectionLost(TidalError, ConnectionError):
    """The connection dropped (or was closed) before the reply came.

    A write sent before the drop may or may not have been applied.
    """


class ConnectFailed(ConnectionLost):
    """No connection could be made (refused, unreachable, TLS handshake failed)."""


class CallTimeout(TidalError, TimeoutError):
    """No reply within the call's timeout; a write may still be applied by the server."""


class ServerError(TidalError):
    """The server answered with an error ``[code, message, data]``; ``data`` is a map
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


class ParseError(ServerError):
    code = ErrorCode.PARSE_ERROR


class InvalidRequest(ServerError):
    code = ErrorCode.INVALID_REQUEST


class MethodNotFound(ServerError):
    code = ErrorCode.METHOD_NOT_FOUND


class InvalidParams(ServerError):
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


_BY_CODE: dict[int, type[ServerError]] = {
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


def unsendable(exc: LocalProtocolError) -> ClientError:
    """The client's error for a request the protocol refused to encode."""
    if exc.code == ErrorCode.TOO_LARGE:
        return RequestTooLarge(str(exc))
    return InvalidArgument(str(exc))


def closed_by_server(params: Any) -> ConnectionLost:
    """The server's ``error`` notification: why it is closing this connection."""
    if type(params) is list and params:
        error = from_wire(params[0] if len(params) == 1 else params)
        return ConnectionLost(f"closed by the server: {error}")
    return ConnectionLost(f"closed by the server: {params!r}")


def from_wire(error: Any) -> ServerError:
    """The exception for a response's error field, whatever shape a server sent."""
    if type(error) is list and len(error) in (2, 3) and type(error[0]) is int:
        code, message = error[:2]
        data = error[2] if len(error) == 3 and type(error[2]) is dict else {}
        cls = _BY_CODE.get(code, ServerError)
        exc = cls(str(message), None if cls is not ServerError else code)
        exc.data = data
        if cls is InvalidParams and "oldest" in data:  # a change feed cursor lost
            return FeedGap(str(message), data["oldest"])
        return exc
    return ServerError(repr(error))

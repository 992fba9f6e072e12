"""What a call can raise: one class per wire error code, all under ``TidalError``."""

from __future__ import annotations

from typing import Any, ClassVar

from tidal.protocol import ErrorCode


class TidalError(Exception):
    """Base of every error the client raises."""


class ConnectionLost(TidalError):
    """The connection dropped (or was closed) before the reply came.

    A write sent before the drop may or may not have been applied.
    """


class CallTimeout(TidalError, TimeoutError):
    """No reply within the call's timeout; a write may still be applied by the server."""


class ServerError(TidalError):
    """The server answered with an error ``[code, message]``."""

    code: ClassVar[int] = 0

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
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


class InternalError(ServerError):
    code = ErrorCode.INTERNAL_ERROR


class Unauthorized(ServerError):
    code = ErrorCode.UNAUTHORIZED


class Unavailable(ServerError):
    """Storage failed on the server: the write was not saved."""

    code = ErrorCode.UNAVAILABLE


class TooLarge(ServerError):
    code = ErrorCode.TOO_LARGE


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
    )
}


def from_wire(error: Any) -> ServerError:
    """The exception for a response's error field, whatever shape a server sent."""
    if type(error) is list and len(error) == 2 and type(error[0]) is int:
        code, message = error
        cls = _BY_CODE.get(code, ServerError)
        return cls(str(message), None if cls is not ServerError else code)
    return ServerError(repr(error))

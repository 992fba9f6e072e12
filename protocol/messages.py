"""The three MessagePack-RPC messages, plus the one event a server must answer with an error."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final, NamedTuple, Protocol, TypeVar

REQUEST: Final = 0
RESPONSE: Final = 1
NOTIFICATION: Final = 2

#: Any msgid MessagePack can carry is echoed back unchanged.
MSGID_MIN: Final = -(2**63)
MSGID_MAX: Final = 2**64 - 1


class Request(NamedTuple):
    msgid: int
    method: str
    params: list[Any]


class Response(NamedTuple):
    msgid: int
    error: Any
    result: Any


class Notification(NamedTuple):
    method: str
    params: list[Any]


class BadRequest(NamedTuple):
    """A request whose msgid is known but whose shape is wrong.

    The stream itself is intact, so the connection survives: the receiver
    answers ``[code, message]`` to ``msgid`` and reads on.
    """

    msgid: int
    code: int
    message: str


_T = TypeVar("_T")


class _TupleNew(Protocol):
    def __call__(self, cls: type[_T], values: Iterable[Any], /) -> _T: ...


#: Builds a NamedTuple from a tuple of its fields without the Python-level
#: ``__new__`` a NamedTuple call goes through; for paths taken per message.
new_tuple: Final[_TupleNew] = tuple.__new__  # type: ignore[assignment]

Message = Request | Response | Notification
Event = Request | Response | Notification | BadRequest

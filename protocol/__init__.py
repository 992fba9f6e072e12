"""MessagePack-RPC for tidal, sans-I/O: no sockets, no event loop, only bytes and messages."""

from .connection import DEFAULT_MAX_MESSAGE_SIZE, Connection, notification_head
from .errors import ErrorCode, LocalProtocolError, ProtocolError, RemoteProtocolError, error_data
from .messages import (
    MSGID_MAX,
    MSGID_MIN,
    RESPONSE,
    BadRequest,
    Event,
    Message,
    Notification,
    Request,
    Response,
)
from .methods import METHODS
from .outcomes import DECODING, NEED_DATA

__all__ = [
    "DECODING",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "METHODS",
    "MSGID_MAX",
    "MSGID_MIN",
    "NEED_DATA",
    "RESPONSE",
    "BadRequest",
    "Connection",
    "ErrorCode",
    "Event",
    "LocalProtocolError",
    "Message",
    "Notification",
    "ProtocolError",
    "RemoteProtocolError",
    "Request",
    "Response",
    "error_data",
    "notification_head",
]

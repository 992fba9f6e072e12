"""The Python client for tidal: ``await Client.connect(host, port)``."""

from .client import Client
from .errors import (
    CallTimeout,
    ClientError,
    ConnectFailed,
    ConnectionLost,
    InternalError,
    InvalidArgument,
    InvalidParams,
    InvalidRequest,
    MethodNotFound,
    ParseError,
    RequestTooLarge,
    ServerError,
    TidalError,
    TooLarge,
    Unauthorized,
    Unavailable,
)
from .sync import SyncClient
from .types import Counts, Event, LeftUsers, Membership, Signal, SignalAck, Tally, Withdrawn

__all__ = [
    "CallTimeout",
    "Client",
    "ClientError",
    "ConnectFailed",
    "ConnectionLost",
    "Counts",
    "Event",
    "InternalError",
    "InvalidArgument",
    "InvalidParams",
    "InvalidRequest",
    "LeftUsers",
    "Membership",
    "MethodNotFound",
    "ParseError",
    "RequestTooLarge",
    "ServerError",
    "Signal",
    "SignalAck",
    "SyncClient",
    "Tally",
    "TidalError",
    "TooLarge",
    "Unauthorized",
    "Unavailable",
    "Withdrawn",
]

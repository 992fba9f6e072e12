"""The Python client for tidal: ``await Client.connect(host, port)``."""

from .client import Client
from .errors import (
    CallTimeout,
    ConnectionLost,
    InternalError,
    InvalidParams,
    InvalidRequest,
    MethodNotFound,
    ParseError,
    ServerError,
    TidalError,
    TooLarge,
    Unauthorized,
    Unavailable,
)
from .sync import SyncClient
from .types import Counts, Membership, Signal, SignalAck, Tally

__all__ = [
    "CallTimeout",
    "Client",
    "ConnectionLost",
    "Counts",
    "InternalError",
    "InvalidParams",
    "InvalidRequest",
    "Membership",
    "MethodNotFound",
    "ParseError",
    "ServerError",
    "Signal",
    "SignalAck",
    "SyncClient",
    "Tally",
    "TidalError",
    "TooLarge",
    "Unauthorized",
    "Unavailable",
]

"""The Python client for tidal: ``await Client.connect(host, port)``."""

from .client import Client
from .cluster import ClusterClient, PartlyApplied
from .consumer import Consumer
from .errors import (
    CallTimeout,
    ClientError,
    ConnectFailed,
    ConnectionLost,
    FeedGap,
    InternalError,
    InvalidArgument,
    InvalidParams,
    InvalidRequest,
    MethodNotFound,
    Moved,
    ParseError,
    RequestTooLarge,
    ServerError,
    TidalError,
    TooLarge,
    Unauthorized,
    Unavailable,
)
from .groupfeed import Delivery
from .subscription import Subscription
from .sync import SyncClient
from .sync_cluster import SyncClusterClient
from .sync_consumer import SyncConsumer
from .types import (
    Catalog,
    Counts,
    Event,
    FeedEvent,
    LeftUsers,
    Membership,
    Ranked,
    Signal,
    SignalAck,
    Stored,
    Tally,
    Top,
    Withdrawn,
)

__all__ = [
    "CallTimeout",
    "Catalog",
    "Client",
    "ClientError",
    "ClusterClient",
    "ConnectFailed",
    "ConnectionLost",
    "Consumer",
    "Counts",
    "Delivery",
    "Event",
    "FeedEvent",
    "FeedGap",
    "InternalError",
    "InvalidArgument",
    "InvalidParams",
    "InvalidRequest",
    "LeftUsers",
    "Membership",
    "MethodNotFound",
    "Moved",
    "ParseError",
    "PartlyApplied",
    "Ranked",
    "RequestTooLarge",
    "ServerError",
    "Signal",
    "SignalAck",
    "Stored",
    "Subscription",
    "SyncClient",
    "SyncClusterClient",
    "SyncConsumer",
    "Tally",
    "TidalError",
    "TooLarge",
    "Top",
    "Unauthorized",
    "Unavailable",
    "Withdrawn",
]

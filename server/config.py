"""Server settings; the CLI fills them from flags and ``TIDAL_*`` environment variables."""

from __future__ import annotations

from dataclasses import dataclass

from tidal.protocol import DEFAULT_MAX_MESSAGE_SIZE

from .aggregates import CHECKPOINT_SECONDS, CHECKPOINT_SIGNALS
from .errors import BadSettings
from .storage import Durability


@dataclass(frozen=True, slots=True)
class Config:
    host: str = "127.0.0.1"
    port: int = 7411
    db: str = "./tidal.db"
    durability: Durability = "full"
    #: A message over this many bytes gets error 3 and its connection is closed.
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    #: Requests read but not yet answered, per connection; past it we stop reading.
    max_inflight: int = 4096
    #: How long a graceful shutdown may take before connections are cut.
    shutdown_timeout: float = 10.0
    #: Aggregates are checkpointed after this many signals or seconds; after a crash,
    #: boot replays the ledger rows since the last checkpoint.
    checkpoint_signals: int = CHECKPOINT_SIGNALS
    checkpoint_seconds: float = CHECKPOINT_SECONDS
    #: When set, a connection's first request must be ``auth(token)``.
    token: str | None = None
    #: Allow listening beyond loopback without a token (protected mode off).
    insecure: bool = False
    #: Connections past this many are told so and closed.
    max_connections: int = 10_000
    #: A connection with nothing in flight that sends no complete request for this
    #: many seconds is closed.
    idle_timeout: float = 300.0
    #: A message must arrive whole within this many seconds of its first byte: a sender
    #: that stalls mid-message would otherwise hold what it sent until idle_timeout.
    message_timeout: float = 30.0
    #: Connections the kernel may queue before they are accepted (capped by somaxconn).
    backlog: int = 4096
    #: Serve Prometheus metrics at http://host:metrics_port/metrics (off when None).
    metrics_port: int | None = None
    #: PEM files: with both, the server speaks TLS only.
    tls_cert: str | None = None
    tls_key: str | None = None
    #: A signal repeating an idempotency key seen this many seconds ago or less is
    #: answered with the first one's acknowledgement; so are only the newest keys.
    idempotency_window: float = 24 * 3600.0
    idempotency_max_keys: int = 1_000_000
    #: A client whose unread replies pass this many bytes is disconnected.
    max_output_buffer: int = 16 * 1024 * 1024

    def check(self) -> None:
        """Refuse settings that could only fail later, on some connection."""
        rules = [
            (self.max_message_size >= 1024, "max_message_size: at least 1024 bytes"),
            (self.max_inflight >= 1, "max_inflight: at least 1"),
            (self.max_connections >= 1, "max_connections: at least 1"),
            (self.max_output_buffer >= 64 * 1024, "max_output_buffer: at least 65536 bytes"),
            (self.idle_timeout > 0, "idle_timeout: more than 0 seconds"),
            (self.message_timeout > 0, "message_timeout: more than 0 seconds"),
            (self.backlog >= 1, "backlog: at least 1"),
            (self.idempotency_window >= 0, "idempotency_window: 0 seconds or more"),
            (self.idempotency_max_keys >= 0, "idempotency_max_keys: 0 or more"),
            (self.checkpoint_signals >= 1, "checkpoint_signals: at least 1"),
            (self.durability in ("full", "normal"), "durability: 'full' or 'normal'"),
        ]
        broken = [rule for ok, rule in rules if not ok]
        if broken:
            raise BadSettings("invalid settings: " + "; ".join(broken))

    def __repr__(self) -> str:  # the token must never reach a log
        fields = ", ".join(
            f"{name}={'***' if name == 'token' and value else value!r}"
            for name, value in ((f, getattr(self, f)) for f in self.__dataclass_fields__)
        )
        return f"Config({fields})"

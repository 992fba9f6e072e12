"""Server settings, declared once.

Each field's metadata is the whole of a setting: the command line's flag
(``--max-inflight``), its environment variable (``TIDAL_MAX_INFLIGHT``), its
help and, through the field's default, its default. ``tidal serve`` builds its
flags from this declaration, and the README's table is checked against it.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field, fields
from typing import Any, Final, Literal

from tidal.protocol import DEFAULT_MAX_MESSAGE_SIZE
from tidal.protocol.limits import MIN_MESSAGE_SIZE
from tidal.protocol.partitions import DEFAULT_PARTITIONS, MAX_PARTITIONS
from tidal.server.core.aggregates import CHECKPOINT_SECONDS, CHECKPOINT_SIGNALS
from tidal.server.core.rewrites import CHUNK as REWRITE_CHUNK
from tidal.server.core.windows import parse_half_life

from .kinds import DAY, MAX_SECONDS, Range, duration

__all__ = ["Config", "duration", "env", "flag", "half_lives", "redact"]

Durability = Literal["full", "normal"]
LEVELS = ("debug", "info", "warning", "error")


MAX_HALF_LIVES: Final = 8
#: a duration that must be above 0: at least a millisecond, at most a day
_SOME: Final = Range(0, DAY, above=True)
#: the largest message a connection may take or send: msgpack's own lengths are 32-bit
MAX_MESSAGE_SIZE: Final = 2**30


def _setting(
    default: Any,
    text: str,
    *,
    kind: str = "",
    choices: tuple[str, ...] = (),
    bounds: Range | None = None,
) -> Any:
    """A field that is also a flag and an environment variable, parsed by the rule of its
    ``kind`` (``tidal.server.kinds``): "count", "duration" (seconds, or 30d, 12h, 90m),
    "size" (``host.parse_size``), "port", "address", "path"; "switch" (a flag without a
    value; the variable is set to anything but "" or "0"); "secret" (given by the token
    options, never echoed); "" (text). ``bounds``: the range a count or duration must be
    in, which ``validity.check`` holds whatever gave the value."""
    metadata = {"help": text, "kind": kind, "choices": choices, "bounds": bounds}
    return field(default=default, metadata=metadata)


@dataclass(frozen=True, slots=True)
class Config:
    host: str = _setting(
        "127.0.0.1",
        "address to listen on (0.0.0.0: every interface, which needs --token or --insecure)",
        kind="address",
    )
    port: int = _setting(7411, "TCP port, 0 for any free one", kind="port")
    db: str = _setting(
        "./tidal.db",
        "SQLite database file, or postgresql://user[:password]@host[:port]/dbname (the"
        " password may come from PGPASSWORD or --db-password-file instead; several hosts,"
        " h1:5432,h2:5432, with ?target_session_attrs=read-write, follow a failover)",
        kind="path",
    )
    standby: bool = _setting(
        False,
        "PostgreSQL only: wait for the database while another tidal serves it, and take over"
        " when that one's session ends (health says standby meanwhile)",
        kind="switch",
    )
    cluster: str | None = _setting(
        None,
        "PostgreSQL only: serve as one node of the cluster of this name: users are split into"
        " partitions, each served by one node (docs/SCALING.md); needs --advertise",
    )
    advertise: str | None = _setting(
        None,
        "with --cluster: host:port where clients reach this node, as partition_map and the"
        " moved error name it; also this node's name in the cluster",
    )
    partitions: int = _setting(
        DEFAULT_PARTITIONS,
        "with --cluster: partitions of a new cluster (fixed once it is made; a node joining"
        " one takes the cluster's number)",
        kind="count",
        bounds=Range(1, MAX_PARTITIONS),
    )
    db_idle_timeout: float = _setting(
        20.0,
        "PostgreSQL: seconds the writer's session may go silent (this tidal paused, or cut"
        " off) before the database ends it and lets a standby take over; tidal keeps it"
        " busy with a probe every quarter of this",
        kind="duration",
        bounds=Range(1, 3600),
    )
    db_password_file: str | None = _setting(
        None,
        "a file holding the PostgreSQL password (a mounted secret), read at start",
        kind="path",
    )
    durability: Durability = _setting(
        "full",
        "full: fsync every group commit, survives power loss; normal: survives a crash of"
        " the process, not of the machine",
        choices=("full", "normal"),
    )
    token: str | None = _setting(
        None, "require auth(token) as each connection's first request", kind="secret"
    )
    insecure: bool = _setting(
        False, "allow listening beyond loopback without a token", kind="switch"
    )
    tls_cert: str | None = _setting(None, "PEM certificate (chain): serve TLS only", kind="path")
    tls_key: str | None = _setting(None, "PEM key", kind="path")
    max_connections: int = _setting(
        10_000,
        "connections past this are told so and closed",
        kind="count",
        bounds=Range(1, 1_000_000),
    )
    idle_timeout: float = _setting(
        300.0,
        "seconds before a silent connection with nothing in flight is closed",
        kind="duration",
        bounds=_SOME,
    )
    message_timeout: float = _setting(
        30.0,
        "seconds a message may take to arrive whole before its connection is closed: a sender"
        " that stalls mid-message would otherwise hold what it sent until the idle timeout",
        kind="duration",
        bounds=_SOME,
    )
    backlog: int = _setting(
        4096,
        "connections the kernel queues before they are accepted (capped by somaxconn)",
        kind="count",
        bounds=Range(1, 65535),
    )
    max_inflight: int = _setting(
        4096,
        "requests and notifications applied but unanswered per connection before reading pauses",
        kind="count",
        bounds=Range(1, 1_000_000),
    )
    max_message_size: int = _setting(
        DEFAULT_MAX_MESSAGE_SIZE,
        "bytes; a larger message gets error 3 and its connection is closed",
        kind="count",
        # at least room for the largest single item a reply carries (a cohort)
        bounds=Range(MIN_MESSAGE_SIZE, MAX_MESSAGE_SIZE),
    )
    max_output_buffer: int = _setting(
        16 * 1024 * 1024,
        "a connection's output allowance: bytes of replies unread or awaited, past which"
        " nothing more of its requests is applied until it reads; earlier replies still"
        " unread past it when new ones are ready disconnect it",
        kind="count",
        bounds=Range(64 * 1024, 2**34),
    )
    shutdown_timeout: float = _setting(
        10.0,
        "seconds a graceful shutdown may take before connections are cut",
        kind="duration",
        bounds=_SOME,
    )
    checkpoint_signals: int = _setting(
        CHECKPOINT_SIGNALS,
        "aggregates are checkpointed after this many signals (boot replays the ledger since)",
        kind="count",
        bounds=Range(1, 10**9),
    )
    checkpoint_seconds: float = _setting(
        CHECKPOINT_SECONDS,
        "... or after this many seconds, whichever comes first (cluster mode: a node's board"
        " at most this often, once 500 commit log records are past the newest checkpoint)",
        kind="duration",
        bounds=_SOME,
    )
    idempotency_window: float = _setting(
        24 * 3600.0,
        "seconds for which a repeated idempotency key is answered with the first acknowledgement",
        kind="duration",
        bounds=Range(0, 365 * DAY),
    )
    idempotency_max_keys: int = _setting(
        1_000_000,
        "idempotency keys kept, newest first",
        kind="count",
        bounds=Range(0, 100_000_000),
    )
    ledger_retention: float = _setting(
        0.0,
        "ledger rows older than this (30d, 12h, 90m, 45s) are deleted, a chunk at a time;"
        " aggregates keep counting them, but purge and erase no longer reach them. 0 keeps"
        " every row",
        kind="duration",
        bounds=Range(0, MAX_SECONDS),
    )
    event_retention: float = _setting(
        30 * 86400.0,
        "change feed events older than this (30d, 12h, 90m, 45s) are deleted; a subscribe"
        " from an id before the oldest kept is refused. 0 keeps every event",
        kind="duration",
        bounds=Range(0, MAX_SECONDS),
    )
    feed_heartbeat: float = _setting(
        5.0,
        "seconds between heartbeats to each change feed subscriber",
        kind="duration",
        bounds=Range(0, 3600, above=True),
    )
    rewrite_chunk: int = _setting(
        REWRITE_CHUNK,
        "rows of a purged or erased user rewritten per commit, once the purge or erase has"
        " taken effect: fewer hold each commit less, and take more commits",
        kind="count",
        bounds=Range(1, 100_000),
    )
    memory_budget: str = _setting(
        "60%",
        "memory the aggregates may take (512M, 2G, or a share of the machine's memory or of"
        " its cgroup's limit, whichever is less); past it, writes that would create"
        " aggregates get error 2 'full:', and everything else goes on. 0: no budget",
        kind="size",
    )
    trend_half_lives: str = _setting(
        "6h",
        "the half-lives top may rank trends by, comma-separated (30m, 6h, 1d); the"
        " first is kept in each aggregate, more cost about 90 bytes per aggregate for a"
        " second and 32 for each after",
        kind="half-lives",
    )
    http: str | None = _setting(
        None,
        "serve HTTP/JSON, Server-Sent Events and the console on HOST:PORT too (beyond"
        " loopback, it needs --token or --insecure, as the TCP port does)",
        kind="endpoint",
    )
    metrics_port: int | None = _setting(
        None, "serve Prometheus metrics at http://HOST:PORT/metrics", kind="port"
    )
    log_level: str = _setting("info", "how much tidal logs", choices=LEVELS)
    log_libraries: str = _setting(
        "warning",
        "how much the libraries under tidal log (aiosqlite logs every statement at debug)",
        choices=LEVELS,
    )
    log_format: str = _setting("text", "json: one object per line", choices=("text", "json"))

    def half_lives(self) -> list[int]:
        """``trend_half_lives`` in seconds, each once, in the order given."""
        return half_lives(self.trend_half_lives)

    def __repr__(self) -> str:  # the token must never reach a log
        shown = ", ".join(
            f"{f.name}={'***' if f.metadata['kind'] == 'secret' and value else value!r}"
            for f, value in (
                (f, redact(v) if f.name == "db" else v)
                for f, v in ((f, getattr(self, f.name)) for f in fields(self))
            )
        )
        return f"Config({shown})"


def half_lives(text: str) -> list[int]:
    """Half-lives in seconds from ``30m,6h``: each once, in the order given."""
    listed = [part.strip() for part in text.split(",")]
    if not 1 <= len(listed) <= MAX_HALF_LIVES:
        raise ValueError(f"1 to {MAX_HALF_LIVES} half-lives, comma-separated")
    return list(dict.fromkeys(parse_half_life(part) for part in listed))


def redact(db: str) -> str:
    """``--db`` as it may be logged or shown: a URL's password left out."""
    parts = urllib.parse.urlsplit(db)
    if "://" not in db or parts.password is None:
        return db
    host = parts.netloc.rsplit("@", 1)[1]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def env(name: str) -> str:
    return "TIDAL_" + name.upper()

"""Server settings, declared once.

Each field's metadata is the whole of a setting: the command line's flag
(``--max-inflight``), its environment variable (``TIDAL_MAX_INFLIGHT``), its
help and, through the field's default, its default. ``tidal serve`` builds its
flags from this declaration, and the README's table is checked against it.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass, field, fields
from typing import Any, Final, Literal

from tidal.protocol import DEFAULT_MAX_MESSAGE_SIZE
from tidal.protocol.limits import MAX_PREDICATE_BYTES, MIN_MESSAGE_SIZE
from tidal.protocol.partitions import DEFAULT_PARTITIONS, MAX_PARTITIONS
from tidal.server.core.aggregates import CHECKPOINT_SECONDS, CHECKPOINT_SIGNALS
from tidal.server.core.rewrites import CHUNK as REWRITE_CHUNK
from tidal.server.core.windows import parse_half_life

from .errors import BadSettings
from .host import parse_size

Durability = Literal["full", "normal"]
LEVELS = ("debug", "info", "warning", "error")


MAX_HALF_LIVES: Final = 8
_NAME: Final = re.compile(r"[A-Za-z0-9._-]{1,64}")
_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str) -> float:
    """Seconds, from ``30d``, ``12h``, ``90m``, ``45s`` or a plain number of seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text.lower())
    if match is None:
        raise ValueError(f"must be a duration such as 30d, 12h, 90m, 45s or 0, got {text!r}")
    return float(match[1]) * _UNITS[match[2] or "s"]


def _setting(default: Any, text: str, *, kind: str = "", choices: tuple[str, ...] = ()) -> Any:
    """A field that is also a flag and an environment variable. ``kind``: "port" (0..65535),
    "switch" (a flag without a value; the variable is set to anything but "" or "0"),
    "secret" (given by the token options, never echoed), "duration" (``duration``),
    "size" (``host.parse_size``)."""
    return field(default=default, metadata={"help": text, "kind": kind, "choices": choices})


@dataclass(frozen=True, slots=True)
class Config:
    host: str = _setting("127.0.0.1", "address to listen on")
    port: int = _setting(7411, "TCP port, 0 for any free one", kind="port")
    db: str = _setting(
        "./tidal.db",
        "SQLite database file, or postgresql://user[:password]@host[:port]/dbname (the"
        " password may come from PGPASSWORD or --db-password-file instead; several hosts,"
        " h1:5432,h2:5432, with ?target_session_attrs=read-write, follow a failover)",
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
    )
    db_idle_timeout: float = _setting(
        20.0,
        "PostgreSQL: seconds the writer's session may go silent (this tidal paused, or cut"
        " off) before the database ends it and lets a standby take over; tidal keeps it"
        " busy with a probe every quarter of this",
    )
    db_password_file: str | None = _setting(
        None, "a file holding the PostgreSQL password (a mounted secret), read at start"
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
    tls_cert: str | None = _setting(None, "PEM certificate (chain): serve TLS only")
    tls_key: str | None = _setting(None, "PEM key")
    max_connections: int = _setting(10_000, "connections past this are told so and closed")
    idle_timeout: float = _setting(
        300.0, "seconds before a silent connection with nothing in flight is closed"
    )
    message_timeout: float = _setting(
        30.0,
        "seconds a message may take to arrive whole before its connection is closed: a sender"
        " that stalls mid-message would otherwise hold what it sent until the idle timeout",
    )
    backlog: int = _setting(
        4096, "connections the kernel queues before they are accepted (capped by somaxconn)"
    )
    max_inflight: int = _setting(
        4096,
        "requests and notifications applied but unanswered per connection before reading pauses",
    )
    max_message_size: int = _setting(
        DEFAULT_MAX_MESSAGE_SIZE,
        "bytes; a larger message gets error 3 and its connection is closed",
    )
    max_output_buffer: int = _setting(
        16 * 1024 * 1024,
        "bytes of earlier replies still unread when new ones are ready, after which a client"
        " is disconnected",
    )
    shutdown_timeout: float = _setting(
        10.0, "seconds a graceful shutdown may take before connections are cut"
    )
    checkpoint_signals: int = _setting(
        CHECKPOINT_SIGNALS,
        "aggregates are checkpointed after this many signals (boot replays the ledger since)",
    )
    checkpoint_seconds: float = _setting(
        CHECKPOINT_SECONDS,
        "... or after this many seconds, whichever comes first (cluster mode: a node's board"
        " at most this often, once 500 commit log records are past the newest checkpoint)",
    )
    idempotency_window: float = _setting(
        24 * 3600.0,
        "seconds for which a repeated idempotency key is answered with the first acknowledgement",
    )
    idempotency_max_keys: int = _setting(1_000_000, "idempotency keys kept, newest first")
    ledger_retention: float = _setting(
        0.0,
        "ledger rows older than this (30d, 12h, 90m, 45s) are deleted, a chunk at a time;"
        " aggregates keep counting them, but purge and erase no longer reach them. 0 keeps"
        " every row",
        kind="duration",
    )
    event_retention: float = _setting(
        30 * 86400.0,
        "change feed events older than this (30d, 12h, 90m, 45s) are deleted; a subscribe"
        " from an id before the oldest kept is refused. 0 keeps every event",
        kind="duration",
    )
    feed_heartbeat: float = _setting(
        5.0, "seconds between heartbeats to each change feed subscriber"
    )
    rewrite_chunk: int = _setting(
        REWRITE_CHUNK,
        "rows of a purged or erased user rewritten per commit, once the purge or erase has"
        " taken effect: fewer hold each commit less, and take more commits",
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
        "the half-lives top may rank trends by, comma-separated (30m, 6h, 1d); each"
        " costs a float per aggregate",
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

    def check(self) -> None:
        """Refuse settings that could only fail later, on some connection."""
        rules = [
            (
                self.max_message_size >= MIN_MESSAGE_SIZE,
                f"max_message_size: at least {MIN_MESSAGE_SIZE} bytes (room for the largest"
                " single item a reply carries: a cohort, with its predicate of up to"
                f" {MAX_PREDICATE_BYTES} bytes)",
            ),
            (self.max_inflight >= 1, "max_inflight: at least 1"),
            (self.max_connections >= 1, "max_connections: at least 1"),
            (self.max_output_buffer >= 64 * 1024, "max_output_buffer: at least 65536 bytes"),
            (self.idle_timeout > 0, "idle_timeout: more than 0 seconds"),
            (self.message_timeout > 0, "message_timeout: more than 0 seconds"),
            (self.shutdown_timeout > 0, "shutdown_timeout: more than 0 seconds"),
            (self.backlog >= 1, "backlog: at least 1"),
            (self.idempotency_window >= 0, "idempotency_window: 0 seconds or more"),
            (self.idempotency_max_keys >= 0, "idempotency_max_keys: 0 or more"),
            (self.checkpoint_signals >= 1, "checkpoint_signals: at least 1"),
            (self.checkpoint_seconds > 0, "checkpoint_seconds: more than 0"),
            (self.ledger_retention >= 0, "ledger_retention: 0 (keep every row) or more"),
            (self.event_retention >= 0, "event_retention: 0 (keep every event) or more"),
            (self.feed_heartbeat > 0, "feed_heartbeat: more than 0 seconds"),
            (1 <= self.rewrite_chunk <= 100_000, "rewrite_chunk: 1 to 100000 rows"),
            (self.db_idle_timeout >= 1, "db_idle_timeout: at least 1 second"),
            (
                not self.standby or self.db.startswith(("postgresql://", "postgres://")),
                "standby: needs a PostgreSQL --db (a SQLite file is served by one process on"
                " one machine: there is nothing for a standby to take over)",
            ),
            *self._cluster_rules(),
        ]
        try:
            self.half_lives()
        except ValueError as exc:
            rules.append((False, f"trend_half_lives: {exc}"))
        try:
            parse_size(self.memory_budget)
        except ValueError as exc:
            rules.append((False, f"memory_budget: {exc}"))
        for f in fields(self):
            choices = f.metadata["choices"]
            if choices and getattr(self, f.name) not in choices:
                rules.append((False, f"{f.name}: one of {', '.join(choices)}"))
        broken = [rule for ok, rule in rules if not ok]
        if broken:
            raise BadSettings("invalid settings: " + "; ".join(broken))

    def _cluster_rules(self) -> list[tuple[bool, str]]:
        if self.cluster is None:
            return []
        address = self.advertise or ""
        host, _, port = address.rpartition(":")
        return [
            (
                self.db.startswith(("postgresql://", "postgres://")),
                "cluster: needs a PostgreSQL --db (the nodes share it)",
            ),
            (
                bool(_NAME.fullmatch(self.cluster)),
                "cluster: 1 to 64 letters, digits, '.', '_' or '-'",
            ),
            (
                bool(host) and port.isdigit() and 1 <= int(port) <= 65535,
                f"advertise: host:port where clients reach this node, got {address!r}",
            ),
            (
                1 <= self.partitions <= MAX_PARTITIONS,
                f"partitions: 1 to {MAX_PARTITIONS}",
            ),
            (not self.standby, "cluster: a node needs no --standby (the others take over)"),
        ]

    def half_lives(self) -> list[int]:
        """``trend_half_lives`` in seconds, each once, in the order given."""
        listed = [part.strip() for part in self.trend_half_lives.split(",")]
        if not 1 <= len(listed) <= MAX_HALF_LIVES:
            raise ValueError(f"1 to {MAX_HALF_LIVES} half-lives, comma-separated")
        return list(dict.fromkeys(parse_half_life(part) for part in listed))

    def __repr__(self) -> str:  # the token must never reach a log
        shown = ", ".join(
            f"{f.name}={'***' if f.metadata['kind'] == 'secret' and value else value!r}"
            for f, value in (
                (f, redact(v) if f.name == "db" else v)
                for f, v in ((f, getattr(self, f.name)) for f in fields(self))
            )
        )
        return f"Config({shown})"


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

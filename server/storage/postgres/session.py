"""A session with the database: opened with what tidal relies on pinned, on a socket
that notices a dead network in seconds; and what its errors mean to tidal."""

from __future__ import annotations

import asyncio
import functools
import json
import socket
from pathlib import Path
from typing import Any, Final, cast

import asyncpg

from tidal.server.errors import DatabaseUnusable
from tidal.server.storage.sqlbulk import Bulk, Try, unnested

CONNECT_TIMEOUT: Final = 5.0
#: A database that stops answering, network and all (a host's power lost, a partition:
#: packets dropped, no reset), is noticed by TCP: keepalive probes after a second idle,
#: and ``TCP_USER_TIMEOUT`` ends the connection once sent data or probes go unacknowledged
#: this long. So a statement or COMMIT on a dead network fails within about
#: ``KEEPALIVE_IDLE + USER_TIMEOUT`` seconds, and the writer reconnects (a lost COMMIT is
#: settled by its batch id).
KEEPALIVE_IDLE: Final = 1
KEEPALIVE_INTERVAL: Final = 1
KEEPALIVE_COUNT: Final = 3
USER_TIMEOUT: Final = 4.0
#: A database that answers TCP but not a statement (a lock held by another session, a
#: stalled disk): every statement but COMMIT is given up after this long, its connection
#: closed, and the batch refused as unavailable. COMMIT waits as long as the database
#: takes (a synchronous standby may hold it); TCP still bounds it on a dead network.
STATEMENT_TIMEOUT: Final = 30.0
#: What tidal relies on in its sessions, whatever the database or role sets by default
#: (``ALTER ROLE ... SET statement_timeout``): given when each connection starts, which takes
#: precedence over those defaults (and so applies to the first statement too) ...
SESSION: Final = {
    # the database's side of the socket: a tidal whose host died or whose network was cut
    # is noticed, its session ended and the lock let go of, in KEEPALIVE_IDLE + count probes
    "tcp_keepalives_idle": str(KEEPALIVE_IDLE),
    "tcp_keepalives_interval": str(KEEPALIVE_INTERVAL),
    "tcp_keepalives_count": str(KEEPALIVE_COUNT),
    "statement_timeout": "0",  # tidal times its statements itself, COMMIT apart
    "lock_timeout": "0",
    "idle_in_transaction_session_timeout": "0",
    "default_transaction_isolation": "read committed",
    "default_transaction_read_only": "off",
    "client_encoding": "UTF8",
}
#: ... and those that only newer servers have, set where the server has them
LATER_SESSION: Final = {
    "idle_session_timeout": "0",  # PostgreSQL 14+: the writer's is set by ``hold_lock``
    "transaction_timeout": "0",  # PostgreSQL 17+
    "tcp_user_timeout": str(int(USER_TIMEOUT * 1000)),  # PostgreSQL 12+, and as for KEEPALIVE
}
#: The writer's session holds the lock: one that goes silent while its socket stays up (a
#: tidal paused, SIGSTOP or a frozen VM, whose kernel still answers keepalives) is ended by
#: the database after ``--db-idle-timeout``, idle or in a transaction, and the lock goes
#: with it. A live writer probes its session well within that (``PROBE_SHARE``).
_HOLD: Final = """
    SELECT count(set_config(name, $1, false)) FROM pg_settings
    WHERE name IN ('idle_session_timeout', 'idle_in_transaction_session_timeout')"""
#: the writer probes its session after this share of ``--db-idle-timeout`` without a commit
PROBE_SHARE: Final = 0.25
_PIN: Final = """
    SELECT count(set_config(name, ($1::jsonb) ->> name, false)), current_setting('server_encoding'),
           current_schema()
    FROM pg_settings WHERE ($1::jsonb) ? name"""

#: a failure to reach the database, or a session it ended: worth trying again
LOST: Final = (
    OSError,
    asyncio.TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.InsufficientResourcesError,
    asyncpg.exceptions.TransactionRollbackError,
)


@functools.lru_cache(maxsize=256)
def numbered(sql: str) -> str:
    """``?`` placeholders as PostgreSQL numbers them: ``$1``, ``$2``..."""
    parts = sql.split("?")
    return parts[0] + "".join(f"${i}{part}" for i, part in enumerate(parts[1:], 1))


@functools.lru_cache(maxsize=64)
def unnest(bulk: Bulk) -> str:
    """Many rows in one statement: one array per column, unnested side by side."""
    return numbered(unnested(bulk))


def why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def read_password(path: str) -> str:
    """A mounted secret: a small file, read once at start."""
    try:
        return Path(path).read_text("utf-8").strip()
    except OSError as exc:
        raise DatabaseUnusable(
            f"--db-password-file {path}: cannot read it: {exc.strerror or exc}"
        ) from None


#: SQLSTATE classes of what the database refuses for the data it is given, not for its own
#: state: cardinality (21), data exceptions (22: a NUL, a character not in the encoding, a
#: number out of range), integrity constraints (23), program limits (54: an index row too large)
_DATA_CLASSES: Final = frozenset({"21", "22", "23", "54"})


def is_data_error(exc: BaseException) -> bool:
    return isinstance(exc, asyncpg.PostgresError) and (exc.sqlstate or "")[:2] in _DATA_CLASSES


async def try_rows(conn: asyncpg.Connection, op: Try, timeout: float | None) -> str | None:
    await conn.execute("SAVEPOINT tidal_try", timeout=timeout)
    try:
        await conn.execute(unnest(op.bulk), *zip(*op.rows, strict=True), timeout=timeout)
    except asyncpg.PostgresError as exc:
        if not is_data_error(exc):
            raise
        await conn.execute("ROLLBACK TO SAVEPOINT tidal_try", timeout=timeout)
        reason: str | None = str(exc)
    else:
        reason = None
    await conn.execute("RELEASE SAVEPOINT tidal_try", timeout=timeout)
    return reason


async def connect(url: str, options: dict[str, Any]) -> asyncpg.Connection:
    """A connection whose socket notices a dead network in seconds (see ``USER_TIMEOUT``)."""
    conn: asyncpg.Connection = await asyncpg.connect(url, **options)
    # asyncpg sets TCP_NODELAY and nothing else; its transport is private, and pinned (0.32)
    transport: asyncio.Transport = cast(Any, conn)._transport
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_COUNT)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(USER_TIMEOUT * 1000))
    return conn


async def pin(conn: asyncpg.Connection) -> tuple[str, str | None]:
    """Set what tidal relies on in this session that only newer servers have
    (``LATER_SESSION``); the database's encoding and the schema tidal's tables are in."""
    row = await conn.fetchrow(_PIN, json.dumps(LATER_SESSION), timeout=STATEMENT_TIMEOUT)
    assert row is not None  # an aggregate: one row
    return row[1], row[2]


async def hold_lock(conn: asyncpg.Connection, idle_timeout: float) -> None:
    """Make this the writer's session: ended by the database if it goes silent (``_HOLD``)."""
    await conn.fetchval(_HOLD, f"{int(idle_timeout * 1000)}ms", timeout=STATEMENT_TIMEOUT)


async def close_quietly(conn: asyncpg.Connection) -> None:
    try:
        await conn.close(timeout=2)
    except Exception:  # gone already, or not answering: the socket goes either way
        conn.terminate()


async def open_session(
    url: str, options: dict[str, Any], location: str
) -> tuple[asyncpg.Connection, str]:
    """The writer's first session, and the schema tidal's tables are in; one line at start
    for what makes the database unusable (no traceback)."""
    try:
        writer = await connect(url, options)
    except Exception as exc:
        raise DatabaseUnusable(f"{location}: cannot connect: {why(exc)}") from None
    try:
        encoding, schema = await pin(writer)
        if encoding != "UTF8":
            raise DatabaseUnusable(
                f"--db {location}: the database's encoding is {encoding}, and tidal needs"
                " UTF8 (names are Unicode: one not in the database's encoding could never"
                " be stored); create it with ENCODING 'UTF8'"
            )
        if schema is None:
            raise DatabaseUnusable(
                f"--db {location}: no schema of the search_path exists to hold tidal's tables"
            )
    except (asyncpg.PostgresError, *LOST) as exc:
        await close_quietly(writer)
        raise DatabaseUnusable(f"{location}: cannot set up the session: {why(exc)}") from None
    except BaseException:
        await close_quietly(writer)
        raise
    return writer, schema

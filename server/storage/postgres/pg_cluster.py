"""Cluster mode's tables and statements: the cluster, its nodes, and which node owns each
partition, at which epoch (``tidal.server.cluster`` decides what to take and release).

A node is alive while its writer's session holds its advisory lock (``lock.NODE_CLASS``):
the database drops the lock the moment that session ends (the process killed, its
network cut once the keepalives give up, or silent past ``--db-idle-timeout``), and the
other nodes then take its partitions. Taking one bumps its epoch; every write
transaction checks the epochs it was written under (``log_sql.FENCE``), so the node that
lost a partition commits nothing more for it, whether or not it knows yet.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Final

import asyncpg
import msgpack

from tidal.protocol.partitions import HASH, partition
from tidal.server.core import log as commit_log
from tidal.server.core.rewrites import Rule
from tidal.server.errors import DatabaseInUse, DatabaseUnusable
from tidal.server.storage.sqlbulk import from_db

from .lock import AdvisoryLock
from .pg_schema import CLUSTER_MIGRATIONS, steps
from .session import STATEMENT_TIMEOUT

#: seqs per block: a node takes a new block when it starts and whenever it takes
#: partitions, so that a user's seqs keep growing from one owner to the next
BLOCK_BITS: Final = 40
#: pg_advisory_xact_lock's key while a node sets the tables up: "tids"
_SETUP: Final = (0x7469_6473, 0)

#: the nodes alive: those whose writer session holds its lock
LIVE: Final = """
    SELECT n.node FROM tidal_nodes n JOIN pg_locks l
      ON l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
     AND l.classid::int8 = n.lock_class AND l.objid::int8 = n.lock_key
     AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"""
_MAP: Final = "SELECT epoch, node FROM tidal_partitions ORDER BY part"
#: a partition nobody serves: handed over, its node's lock gone, or this node's own from its
#: last run (restarted with its address before the others saw it gone: only one process
#: holds a node's lock, so a live ``$1`` is this one); of two nodes taking one at once, the
#: second finds it taken when the first commits, and skips it
_TAKE: Final = f"""
    UPDATE tidal_partitions SET epoch = epoch + 1, node = $1
    WHERE part = ANY($2::int[]) AND (node IS NULL OR node = $1 OR node NOT IN ({LIVE}))
    RETURNING part, epoch"""
_RELEASE: Final = """
    UPDATE tidal_partitions SET node = NULL
    WHERE node = $1 AND part = ANY($2::int[]) AND epoch = ANY($3::bigint[])"""
_BLOCK: Final = "UPDATE tidal_cluster SET next_block = next_block + 1 RETURNING next_block - 1"
_MEMBERS: Final = 'SELECT user_id, "left", left_at_ns FROM memberships'
_KEYS: Final = """
    SELECT k.key, k.seq, k.forwarded, k.ts_ns, l.user_id
    FROM signal_keys k JOIN ledger l ON l.seq = k.seq
    WHERE k.ts_ns >= $1 ORDER BY k.ts_ns DESC LIMIT $2"""

_RULES: Final = "SELECT user_id, purge_before, erase_before FROM rewrites"


@dataclass(slots=True)
class PartitionState:
    """What a node loads for the partitions it takes: their users' leave state and keys,
    and the rules of their purges and erasures whose rows are still to rewrite."""

    left: dict[int, int]
    rejoined: dict[int, int]
    keys: OrderedDict[str, tuple[int, bool, int, int | None]]
    rules: dict[int, Rule] = field(default_factory=dict)  # by user_id


async def join(
    conn: asyncpg.Connection,
    location: str,
    cluster: str,
    node: str,
    partitions: int,
    schema_lock: AdvisoryLock,
    node_lock: AdvisoryLock,
) -> int:
    """Make the tables if this is the cluster's first node, and name this node in them.
    The number of partitions: the cluster's, fixed when it was made."""
    holder = await schema_lock.holder_row(conn)
    if holder is not None:
        raise DatabaseInUse(
            f"--db {location}: a tidal not in cluster mode (backend pid {holder['pid']})"
            " serves this database; stop it first"
        )
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1, $2)", *_SETUP)
        await steps(conn, f"--db {location}", CLUSTER_MIGRATIONS, "tidal_cluster_schema", "cluster")
        row = await conn.fetchrow("SELECT name, partitions, hash, log_format FROM tidal_cluster")
        if row is None:
            top = await conn.fetchval("SELECT COALESCE(MAX(seq), 0) FROM ledger")
            await conn.execute(
                "INSERT INTO tidal_cluster (name, partitions, hash, next_block)"
                " VALUES ($1, $2, $3, $4)",
                cluster,
                partitions,
                HASH,
                (top >> BLOCK_BITS) + 1,
            )
            await conn.execute(
                "INSERT INTO tidal_partitions SELECT part, 0, NULL"
                " FROM generate_series(0, $1 - 1) AS part",
                partitions,
            )
        elif row["name"] != cluster:
            raise DatabaseUnusable(
                f"--db {location} holds the cluster {row['name']!r}, not {cluster!r}: give"
                " this cluster a database (or a schema) of its own, or name that one"
            )
        elif row["hash"] != HASH:
            raise DatabaseUnusable(
                f"--db {location}: its cluster hashes users with {row['hash']!r}; this tidal"
                f" knows {HASH!r} only"
            )
        elif row["log_format"] > commit_log.FORMAT:
            raise DatabaseUnusable(
                f"--db {location}: its cluster's commit log is in form {row['log_format']}; this"
                f" tidal reads form {commit_log.FORMAT} at most: run the newer tidal its nodes run"
            )
        else:
            partitions = row["partitions"]
        await conn.execute(
            "UPDATE tidal_cluster SET log_format = $1 WHERE log_format < $1", commit_log.FORMAT
        )
        await conn.execute(
            "INSERT INTO tidal_nodes VALUES ($1, $2, $3) ON CONFLICT (node) DO UPDATE"
            " SET lock_class = excluded.lock_class, lock_key = excluded.lock_key",
            node,
            node_lock.key[0],
            node_lock.key[1] & 0xFFFF_FFFF,
        )
    return int(partitions)


_LOG_AFTER: Final = f"SELECT {commit_log.COLUMNS} FROM tidal_log WHERE id > $1 ORDER BY id LIMIT $2"
_NEWEST: Final = "SELECT log_id, board FROM tidal_checkpoints ORDER BY log_id DESC LIMIT 1"
_CHECKPOINT: Final = """
    INSERT INTO tidal_checkpoints (node, log_id, at_ns, board) VALUES ($1, $2, $3, $4)
    ON CONFLICT (node) DO UPDATE SET log_id = excluded.log_id, at_ns = excluded.at_ns,
        board = excluded.board"""
#: the log below what the newest checkpoint covers and every live node has applied (a
#: node's published ``applied`` is never ahead of its own): no node needs it any more, a
#: booting one loads that checkpoint; a node away past it stops (``replica``)
_PRUNE: Final = f"""
    DELETE FROM tidal_log WHERE id <= LEAST(
        (SELECT MAX(log_id) FROM tidal_checkpoints),
        (SELECT MIN(applied) FROM tidal_nodes WHERE node IN ({LIVE})))"""
_PUBLISH: Final = "UPDATE tidal_nodes SET applied = $2 WHERE node = $1"


@dataclass(slots=True)
class Shared:
    """What every node keeps whole, as of one snapshot: the cohorts and the commit log."""

    cohorts: list[tuple[int, str, Any]]
    next_cohort_id: int
    board: bytes | None  # the newest checkpoint (``core.snapshot``), if any
    head: int  # the log's last id
    version: int  # cohort changes committed
    events: int  # the change feed's last event id
    records: list[commit_log.Row]


async def shared(conn: asyncpg.Connection) -> Shared:
    """At boot: the cohorts, the newest checkpoint and the log past it, in one snapshot (the
    board is the log's sum)."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        row = await conn.fetchrow("SELECT log_id, cohorts, events FROM tidal_cluster")
        assert row is not None  # made with the cluster
        head, version, events = row
        rows = await conn.fetch("SELECT id, name, predicate FROM cohorts ORDER BY id")
        cohorts = [(cid, name, msgpack.unpackb(blob, raw=False)) for cid, name, blob in rows]
        next_id = await conn.fetchval("SELECT value FROM meta WHERE key = 'next_cohort_id'")
        newest = await conn.fetchrow(_NEWEST)
        since = 0 if newest is None else newest["log_id"]
        records = await conn.fetch(
            f"SELECT {commit_log.COLUMNS} FROM tidal_log WHERE id > $1 ORDER BY id", since
        )
    log = [tuple(r) for r in records]
    board = None if newest is None else bytes(newest["board"])
    return Shared(cohorts, int(next_id or 1), board, head, version, events, log)


async def checkpoint(
    conn: asyncpg.Connection, node: str, log_id: int, now_ns: int, board: bytes
) -> int:
    """This node's board as of ``log_id``; then the log no node needs any more goes. How
    many records went."""
    async with conn.transaction():
        await conn.execute(_CHECKPOINT, node, log_id, now_ns, board, timeout=STATEMENT_TIMEOUT)
    status = await conn.execute(_PRUNE, timeout=STATEMENT_TIMEOUT)
    return int(status.rsplit(" ", 1)[1])


async def newest_checkpoint(conn: asyncpg.Connection) -> int:
    """The log id the newest checkpoint covers (0: none)."""
    newest: int | None = await conn.fetchval(
        "SELECT MAX(log_id) FROM tidal_checkpoints", timeout=STATEMENT_TIMEOUT
    )
    return newest or 0


async def publish(conn: asyncpg.Connection, node: str, applied: int) -> None:
    """How far this node has applied the log: the log below is kept until every node has."""
    await conn.execute(_PUBLISH, node, applied, timeout=STATEMENT_TIMEOUT)


async def log_after(
    conn: asyncpg.Connection, applied: int, most: int = 10_000
) -> list[commit_log.Row]:
    """The log's records past ``applied``, in id order: everything committed before this
    read (ids are given under one lock, in commit order), up to ``most``."""
    rows = await conn.fetch(_LOG_AFTER, applied, most, timeout=STATEMENT_TIMEOUT)
    return [tuple(r) for r in rows]


async def cluster_of(conn: asyncpg.Connection) -> str | None:
    """The cluster whose database this is, if one is: a tidal not in cluster mode refuses it."""
    if not await conn.fetchval("SELECT to_regclass('tidal_cluster') IS NOT NULL"):
        return None
    name: str | None = await conn.fetchval("SELECT name FROM tidal_cluster")
    return name


async def read_map(conn: asyncpg.Connection) -> tuple[set[str], list[tuple[str | None, int]]]:
    """The nodes alive, and each partition's (node, epoch)."""
    live = {row[0] for row in await conn.fetch(LIVE, timeout=STATEMENT_TIMEOUT)}
    rows = await conn.fetch(_MAP, timeout=STATEMENT_TIMEOUT)
    return live, [(row["node"], row["epoch"]) for row in rows]


async def take(conn: asyncpg.Connection, node: str, parts: list[int]) -> dict[int, int]:
    """The partitions of ``parts`` this node now owns, each at its new epoch."""
    rows = await conn.fetch(_TAKE, node, parts, timeout=STATEMENT_TIMEOUT)
    return {row["part"]: row["epoch"] for row in rows}


async def release(conn: asyncpg.Connection, node: str, parts: dict[int, int]) -> None:
    await conn.execute(_RELEASE, node, list(parts), list(parts.values()), timeout=STATEMENT_TIMEOUT)


async def block(conn: asyncpg.Connection) -> int:
    """The first seq of a block of seqs no node has used (blocks start at 1 past a
    multiple of ``userrows.BLOCK``)."""
    number: int = await conn.fetchval(_BLOCK, timeout=STATEMENT_TIMEOUT)
    return (number << BLOCK_BITS) + 1


async def load(
    conn: asyncpg.Connection,
    parts: set[int],
    partitions: int,
    keys_since_ns: int,
    max_keys: int,
) -> PartitionState:
    """The state of ``parts``' users, read after this node took them: every commit of the
    node before is visible, and none after can happen (its epochs no longer match)."""

    def ours(user: int) -> bool:
        return partition(user, partitions) in parts

    state = PartitionState({}, {}, OrderedDict())
    for user, left, at in await conn.fetch(_MEMBERS, timeout=None):
        uid = from_db(user)
        if ours(uid):
            (state.left if left else state.rejoined)[uid] = at
    rows: list[Any] = await conn.fetch(_KEYS, keys_since_ns, max_keys, timeout=None)
    for key, seq, forwarded, ts, user in reversed(rows):
        if ours(from_db(user)):
            state.keys[key] = (seq, bool(forwarded), ts, from_db(user))
    for user, purge_before, erase_before in await conn.fetch(_RULES, timeout=None):
        if ours(from_db(user)):
            state.rules[from_db(user)] = Rule(purge_before, erase_before)
    return state

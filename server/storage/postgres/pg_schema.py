"""The PostgreSQL schema and its migrations: the same tables as SQLite's, typed.

Text that is ordered or paged (entities, kinds, names, keys) compares byte by
byte (``COLLATE "C"``), as SQLite and the engine compare it, whatever the
database's locale. ``tidal_schema`` says which version is there, as SQLite's
``PRAGMA user_version`` does.
"""

from __future__ import annotations

from typing import Final

import asyncpg

from tidal.server.errors import DatabaseUnusable
from tidal.server.storage.sqlbulk import LEDGER_COUNTED
from tidal.server.storage.versions import spans, told

#: Each entry takes the schema from version i to i + 1. Version 1 is SQLite's version 4,
#: version 2 its version 5, and so on.
MIGRATIONS: Final[list[list[str]]] = [
    [
        """CREATE TABLE ledger (
            seq BIGINT PRIMARY KEY,
            user_id BIGINT NOT NULL,
            entity TEXT COLLATE "C" NOT NULL,
            kind TEXT COLLATE "C" NOT NULL,
            weight DOUBLE PRECISION NOT NULL,
            ts_ns BIGINT NOT NULL,
            forwarded SMALLINT NOT NULL,
            context BYTEA  -- msgpack [communities, attrs, cohort ids]: what it named and reached
        )""",
        # A view of the ledger up to meta.aggregates_seq (see aggregates.py).
        # layer 0 ledger, 1 cohort (cohort = its id), 2 community (name = its name)
        """CREATE TABLE aggregates (
            entity TEXT COLLATE "C" NOT NULL,
            layer SMALLINT NOT NULL,
            cohort BIGINT NOT NULL,
            name TEXT COLLATE "C" NOT NULL,
            kind TEXT COLLATE "C" NOT NULL,
            count BIGINT NOT NULL,
            weight DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (entity, layer, cohort, name, kind)
        )""",
        """CREATE TABLE memberships (
            user_id BIGINT PRIMARY KEY,
            "left" SMALLINT NOT NULL,
            left_at_ns BIGINT NOT NULL
        )""",
        """CREATE TABLE cohorts (
            id BIGINT PRIMARY KEY,
            name TEXT COLLATE "C" NOT NULL UNIQUE,
            predicate BYTEA NOT NULL
        )""",
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value BIGINT NOT NULL)",
        """CREATE TABLE signal_keys (
            key TEXT COLLATE "C" PRIMARY KEY,
            seq BIGINT NOT NULL,
            forwarded SMALLINT NOT NULL,
            ts_ns BIGINT NOT NULL
        )""",
        "CREATE INDEX signal_keys_by_time ON signal_keys (ts_ns)",
        "CREATE INDEX signal_keys_by_seq ON signal_keys (seq)",
        "CREATE TABLE ledger_users (first_seq BIGINT PRIMARY KEY, users BYTEA NOT NULL)",
        """CREATE TABLE history (
            user_id BIGINT NOT NULL,
            at_ns BIGINT NOT NULL,
            event SMALLINT NOT NULL,  -- 1 leave, 2 rejoin, 3 purge, 4 erase
            signals BIGINT  -- purged or erased; NULL for leave and rejoin
        )""",
        "CREATE INDEX history_by_user ON history (user_id, at_ns)",
        "CREATE INDEX history_by_time ON history (at_ns)",
    ],
    [
        # SQLite's version 5: when the signal happened, and the board's buckets
        "ALTER TABLE ledger ADD COLUMN at_ns BIGINT",
        """CREATE TABLE buckets (
            entity TEXT COLLATE "C" NOT NULL,
            layer SMALLINT NOT NULL,
            cohort BIGINT NOT NULL,
            name TEXT COLLATE "C" NOT NULL,
            kind TEXT COLLATE "C" NOT NULL,
            tier SMALLINT NOT NULL,  -- 0 minute, 1 hour, 2 decayed sum (bucket: half-life, s)
            bucket BIGINT NOT NULL,
            count BIGINT NOT NULL,
            weight DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (entity, layer, cohort, name, kind, tier, bucket)
        )""",
        "CREATE INDEX buckets_by_time ON buckets (tier, bucket)",
    ],
    [
        # SQLite's version 6: what a purge or erase took off, until the next checkpoint
        "CREATE TABLE withdrawals (id BIGINT PRIMARY KEY, data BYTEA NOT NULL)",
    ],
    [
        # SQLite's version 7: the board in chunks and parts (core/chunks.py); the first
        # checkpoint moves it there from aggregates and buckets, and empties them
        """CREATE TABLE board_chunks (
            chunk BIGINT PRIMARY KEY,
            decay BYTEA NOT NULL,
            records BYTEA NOT NULL
        )""",
        """CREATE TABLE board_parts (
            tier SMALLINT NOT NULL,
            bucket BIGINT NOT NULL,
            part INTEGER NOT NULL,
            entries BYTEA NOT NULL,
            PRIMARY KEY (tier, bucket, part)
        )""",
    ],
    [
        # SQLite's version 8: the change feed (core/feed.py). Its ids are given by the one
        # writer, in commit order, not by a sequence (whose values commit out of order)
        """CREATE TABLE events (
            id BIGINT PRIMARY KEY,
            at_ns BIGINT NOT NULL,
            kind SMALLINT NOT NULL,
            data BYTEA NOT NULL
        )""",
    ],
    [
        # SQLite's version 9: a purge's or erase's rows still to rewrite (core/rewrites.py)
        """CREATE TABLE rewrites (
            user_id BIGINT PRIMARY KEY,
            purge_before BIGINT NOT NULL,
            erase_before BIGINT NOT NULL
        )""",
        LEDGER_COUNTED,  # the ledger as it counts, for whoever reads the database
    ],
    [
        # SQLite's version 10: consumer groups (core/groups.py): each group's settings, cursor and
        # the events it lost to retention; a row per event it sent (its count), acknowledged
        # past its cursor, or dead-lettered (with the event's data); each user's latest
        # leave, purge and erase, whose acknowledgements are the user's receipt
        """CREATE TABLE groups (
            name TEXT PRIMARY KEY,
            start BIGINT NOT NULL,
            cursor BIGINT NOT NULL,
            ack_wait_ns BIGINT NOT NULL,
            max_deliveries INTEGER NOT NULL,
            wait SMALLINT NOT NULL,
            kinds BYTEA,
            created_ns BIGINT NOT NULL,
            lost_first BIGINT,
            lost_last BIGINT
        )""",
        """CREATE TABLE group_events (
            grp TEXT NOT NULL,
            event_id BIGINT NOT NULL,
            user_id BIGINT,
            kind SMALLINT NOT NULL,
            at_ns BIGINT NOT NULL,
            deliveries INTEGER NOT NULL,
            first_ns BIGINT NOT NULL,
            state SMALLINT NOT NULL,  -- 0 pending, 1 dead letter, 2 acknowledged
            done_ns BIGINT NOT NULL,
            reason TEXT NOT NULL,
            data BYTEA,
            PRIMARY KEY (grp, event_id)
        )""",
        "CREATE INDEX group_events_by_event ON group_events (event_id)",
        """CREATE TABLE optouts (
            user_id BIGINT NOT NULL,
            kind SMALLINT NOT NULL,
            event_id BIGINT NOT NULL,
            at_ns BIGINT NOT NULL,
            PRIMARY KEY (user_id, kind)
        )""",
        "CREATE INDEX optouts_by_time ON optouts (at_ns)",
    ],
]
SCHEMA_VERSION: Final = len(MIGRATIONS)


#: cluster mode's tables (``cluster``), migrated as the database's are (``steps``). The
#: first five steps are idempotent: clusters made before this list was versioned run them
#: again, harmlessly
CLUSTER_MIGRATIONS: Final[list[list[str]]] = [
    [
        """CREATE TABLE IF NOT EXISTS tidal_cluster (
            name TEXT PRIMARY KEY,
            partitions INT NOT NULL,
            hash TEXT NOT NULL,
            next_block BIGINT NOT NULL,  -- the next block of seqs a node may take
            log_id BIGINT NOT NULL DEFAULT 0,  -- the commit log's last id (``core.log``)
            cohorts BIGINT NOT NULL DEFAULT 0,  -- cohort changes committed: their version
            events BIGINT NOT NULL DEFAULT 0  -- the change feed's last event id
        )""",
        """CREATE TABLE IF NOT EXISTS tidal_log (
            id BIGINT PRIMARY KEY,
            node TEXT NOT NULL,
            record BYTEA NOT NULL  -- msgpack: what the commit added to the board, cohort changes
        )""",
        """CREATE TABLE IF NOT EXISTS tidal_nodes (
            node TEXT PRIMARY KEY,  -- its --advertise address
            lock_class BIGINT NOT NULL,  -- the advisory lock its writer holds while alive
            lock_key BIGINT NOT NULL
        )""",
    ],
    ["ALTER TABLE tidal_nodes ADD COLUMN IF NOT EXISTS applied BIGINT NOT NULL DEFAULT 0"],
    [
        # a batch of signals only: its ledger rows' columns, its record empty (``core.log``):
        # the log's second form, which a node of an earlier tidal cannot read
        "ALTER TABLE tidal_cluster ADD COLUMN IF NOT EXISTS log_format INT NOT NULL DEFAULT 1",
        """ALTER TABLE tidal_log ADD COLUMN IF NOT EXISTS entities TEXT[],
            ADD COLUMN IF NOT EXISTS kinds TEXT[], ADD COLUMN IF NOT EXISTS weights FLOAT8[],
            ADD COLUMN IF NOT EXISTS ts BIGINT[], ADD COLUMN IF NOT EXISTS ats BIGINT[],
            ADD COLUMN IF NOT EXISTS forwarded SMALLINT[],
            ADD COLUMN IF NOT EXISTS contexts BYTEA[]""",
    ],
    [
        """CREATE TABLE IF NOT EXISTS tidal_checkpoints (
            node TEXT PRIMARY KEY,
            log_id BIGINT NOT NULL,  -- the last log record the board holds
            at_ns BIGINT NOT NULL,
            board BYTEA NOT NULL  -- ``core.snapshot``
        )""",
    ],
    [
        """CREATE TABLE IF NOT EXISTS tidal_partitions (
            part INT PRIMARY KEY,
            epoch BIGINT NOT NULL,  -- bumped by each take: what every write transaction checks
            node TEXT  -- the node that took it last; NULL once handed over
        )""",
    ],
]

#: pg_advisory_lock's key while cluster nodes migrate, one at a time: "tidm"
_MIGRATING: Final = (0x7469_646D, 0)


async def migrate(db: asyncpg.Connection, location: str, *, shared: bool = False) -> None:
    """Under the advisory lock: no other tidal migrates at the same time. Cluster nodes
    (``shared``) each hold a lock of their own, and take turns for this one."""
    if shared:
        await db.execute("SELECT pg_advisory_lock($1, $2)", *_MIGRATING)
        try:
            await _migrate(db, location)
        finally:
            await db.execute("SELECT pg_advisory_unlock($1, $2)", *_MIGRATING)
        return
    await _migrate(db, location)


async def _migrate(db: asyncpg.Connection, location: str) -> None:
    await db.execute("CREATE TABLE IF NOT EXISTS tidal_schema (version INT NOT NULL)")
    version = await db.fetchval("SELECT MAX(version) FROM tidal_schema") or 0
    if version == 0 and await db.fetchval("SELECT to_regclass('ledger') IS NOT NULL"):
        raise DatabaseUnusable(
            f"{location} has a table named ledger that tidal did not make; give tidal a"
            " database (or a schema, through search_path) of its own"
        )
    await steps(db, location, MIGRATIONS, "tidal_schema", "database")


async def steps(
    db: asyncpg.Connection, location: str, migrations: list[list[str]], table: str, what: str
) -> None:
    """The ``migrations`` past the version ``table`` records, each step in a transaction
    of its own (inside the caller's, a savepoint) with its version: the one shape every
    list of migrations has (the database's here, cluster mode's in ``cluster``)."""
    await db.execute(f"CREATE TABLE IF NOT EXISTS {table} (version INT NOT NULL)")
    version = await db.fetchval(f"SELECT MAX(version) FROM {table}") or 0
    if version > len(migrations):
        raise DatabaseUnusable(
            f"{location} has tidal {what} schema version {version}, newer than this tidal"
            f" understands ({len(migrations)}): it was written by a newer tidal; run that"
            " version, or restore a dump taken before the upgrade"
        )
    for first, last in spans(version, len(migrations)):
        async with db.transaction():
            for step in migrations[first:last]:
                for statement in step:
                    await db.execute(statement)
            versions = f"INSERT INTO {table} (version) SELECT generate_series($1::int, $2)"
            await db.execute(versions, first + 1, last)  # a row per version, as ever
    told(what, version, len(migrations))

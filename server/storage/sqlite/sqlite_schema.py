"""Opening a database: the schema and its migrations, the checks at boot, and why it
cannot be opened, told the operator's way (damage apart from everything else)."""

from __future__ import annotations

import os
import sqlite3
import stat
from typing import Final

import aiosqlite

from tidal.server.errors import CorruptDatabase, DatabaseUnusable
from tidal.server.storage.sqlbulk import LEDGER_COUNTED
from tidal.server.storage.versions import spans, told

#: Each entry takes the schema from version i to i + 1; ``PRAGMA user_version`` says where we are.
MIGRATIONS: Final[list[list[str]]] = [
    [
        """CREATE TABLE ledger (
            seq INTEGER PRIMARY KEY,
            user_id INTEGER NOT NULL,
            entity TEXT NOT NULL,
            kind TEXT NOT NULL,
            weight REAL NOT NULL,
            ts_ns INTEGER NOT NULL,
            forwarded INTEGER NOT NULL,
            context BLOB  -- msgpack [communities, attrs, cohort ids]: what it named and reached
        )""",
        # A view of the ledger up to meta.aggregates_seq (see aggregates.py).
        # layer 0 ledger (key ''), 1 cohort (key = cohort id), 2 community (key = name)
        """CREATE TABLE aggregates (
            entity TEXT NOT NULL,
            layer INTEGER NOT NULL,
            key NOT NULL,  -- no type: no affinity, so a community named "007" stays text
            kind TEXT NOT NULL,
            count INTEGER NOT NULL,
            weight REAL NOT NULL,
            PRIMARY KEY (entity, layer, key, kind)
        ) WITHOUT ROWID""",
        """CREATE TABLE memberships (
            user_id INTEGER PRIMARY KEY,
            left INTEGER NOT NULL,
            left_at_ns INTEGER NOT NULL
        )""",
        """CREATE TABLE cohorts (
            id INTEGER PRIMARY KEY,
            name TEXT NOT NULL UNIQUE,
            predicate BLOB NOT NULL
        )""",
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value) WITHOUT ROWID",
    ],
    [
        # idempotency keys of signals (context "id"), kept for the retention window
        """CREATE TABLE signal_keys (
            key TEXT PRIMARY KEY,
            seq INTEGER NOT NULL,
            forwarded INTEGER NOT NULL,
            ts_ns INTEGER NOT NULL
        ) WITHOUT ROWID""",
        "CREATE INDEX signal_keys_by_time ON signal_keys (ts_ns)",
    ],
    [
        # the user of each ledger row, packed by blocks of seqs (see userrows.py); blocks
        # for the rows already there are written at boot
        """CREATE TABLE ledger_users (
            first_seq INTEGER PRIMARY KEY,
            users BLOB NOT NULL
        )""",
        "CREATE INDEX signal_keys_by_seq ON signal_keys (seq)",  # an erased row's key
        # leave, rejoin, purge and erase of each user; at_ns increases across all events
        """CREATE TABLE history (
            user_id INTEGER NOT NULL,
            at_ns INTEGER NOT NULL,
            event INTEGER NOT NULL,  -- 1 leave, 2 rejoin, 3 purge, 4 erase
            signals INTEGER  -- purged or erased; NULL for leave and rejoin
        )""",
        "CREATE INDEX history_by_user ON history (user_id, at_ns)",
        # the past before history was kept: each user's last leave
        """INSERT INTO history (user_id, at_ns, event)
            SELECT user_id, left_at_ns, 1 FROM memberships ORDER BY left_at_ns""",
    ],
    [
        # the aggregate's key in two typed columns, as PostgreSQL keeps it: one order in
        # both (cohort ids as numbers, names byte by byte), and the same SQL for both
        """CREATE TABLE aggregates_by_column (
            entity TEXT NOT NULL,
            layer INTEGER NOT NULL,
            cohort INTEGER NOT NULL,  -- the cohort's id in layer 1, else 0
            name TEXT NOT NULL,  -- the community's name in layer 2, else ''
            kind TEXT NOT NULL,
            count INTEGER NOT NULL,
            weight REAL NOT NULL,
            PRIMARY KEY (entity, layer, cohort, name, kind)
        ) WITHOUT ROWID""",
        """INSERT INTO aggregates_by_column
            SELECT entity, layer, CASE layer WHEN 1 THEN key ELSE 0 END,
                CASE layer WHEN 1 THEN '' ELSE key END, kind, count, weight
            FROM aggregates""",
        "DROP TABLE aggregates",
        "ALTER TABLE aggregates_by_column RENAME TO aggregates",
        "CREATE INDEX history_by_time ON history (at_ns)",  # the latest event, at boot
    ],
    [
        # when the signal happened, if the caller said (context at_ns); else it is ts_ns
        "ALTER TABLE ledger ADD COLUMN at_ns INTEGER",
        # the board (storage/buckets.py): minute and hour buckets, and decayed sums, of each
        # aggregate; a view of the ledger up to meta.board_seq, filled from it at first boot
        """CREATE TABLE buckets (
            entity TEXT NOT NULL,
            layer INTEGER NOT NULL,
            cohort INTEGER NOT NULL,
            name TEXT NOT NULL,
            kind TEXT NOT NULL,
            tier INTEGER NOT NULL,  -- 0 minute, 1 hour, 2 decayed sum (bucket: half-life, s)
            bucket INTEGER NOT NULL,
            count INTEGER NOT NULL,
            weight REAL NOT NULL,
            PRIMARY KEY (entity, layer, cohort, name, kind, tier, bucket)
        ) WITHOUT ROWID""",
        "CREATE INDEX buckets_by_time ON buckets (tier, bucket)",
    ],
    [
        # what a purge or erase took off the tables, until the next checkpoint writes the
        # aggregates it changed (storage/buckets.py)
        "CREATE TABLE withdrawals (id INTEGER PRIMARY KEY, data BLOB NOT NULL)",
    ],
    [
        # the board in few large rows (core/chunks.py): the tallies' records in a log of
        # chunks, each bucket's entries in parts; the first checkpoint moves the board
        # there from aggregates and buckets, and empties them
        """CREATE TABLE board_chunks (
            chunk INTEGER PRIMARY KEY,
            decay BLOB NOT NULL,  -- msgpack [[half-life s, base ns], ...] of its sums
            records BLOB NOT NULL
        )""",
        """CREATE TABLE board_parts (
            tier INTEGER NOT NULL,  -- 0 minute, 1 hour
            bucket INTEGER NOT NULL,
            part INTEGER NOT NULL,
            entries BLOB NOT NULL,
            PRIMARY KEY (tier, bucket, part)
        )""",
    ],
    [
        # the change feed (core/feed.py): each leave, rejoin, purge, erase and cohort
        # change, written with it; ids increase by 1 per event, times with them
        """CREATE TABLE events (
            id INTEGER PRIMARY KEY,
            at_ns INTEGER NOT NULL,
            kind INTEGER NOT NULL,  -- 1 leave, 2 rejoin, 3 purge, 4 erase, 5 define, 6 drop
            data BLOB NOT NULL  -- the event as pushed: a msgpack map
        )""",
    ],
    [
        # a purge's or erase's rows still to rewrite (core/rewrites.py): the user's rows
        # below erase_before count as gone, those below purge_before as not forwarded
        """CREATE TABLE rewrites (
            user_id INTEGER PRIMARY KEY,
            purge_before INTEGER NOT NULL,
            erase_before INTEGER NOT NULL
        )""",
        LEDGER_COUNTED,  # the ledger as it counts, for whoever reads the database
    ],
    [
        # consumer groups (core/groups.py): each group's settings, cursor and
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
            kinds BLOB,
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
            data BLOB,
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


_RECOVER = (
    "tidal will not serve a damaged database. Restore the file (and its -wal) from a backup,"
    " or keep what can be read with: sqlite3 DB '.recover' | sqlite3 NEW.db"
)


async def check(db: aiosqlite.Connection, location: str) -> None:
    """``PRAGMA quick_check`` before anything is read: a damaged file stops the boot."""
    problems = [row[0] for row in await db.execute_fetchall("PRAGMA quick_check(5)")]
    if problems != ["ok"]:
        raise CorruptDatabase(f"{location} failed its integrity check: {problems}; {_RECOVER}")


def check_writable(location: str) -> None:
    """A read-only file is healthy, not damaged: say so before SQLite calls it a failure."""
    if os.path.exists(location) and not os.access(location, os.W_OK):
        mode = stat.filemode(os.stat(location).st_mode)
        raise DatabaseUnusable(
            f"{location} is read-only ({mode}) for uid {os.getuid()}; tidal needs to write it"
            " (check its mode, owner and mount)"
        )


def explain(location: str, exc: sqlite3.Error) -> Exception:
    """The operator's view of a failure to open: damage is told apart from everything else."""
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    if code in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
        return CorruptDatabase(f"{location}: {exc}; {_RECOVER}")
    if code == sqlite3.SQLITE_READONLY:
        return DatabaseUnusable(
            f"{location} is read-only ({exc}); tidal needs to write it and the files beside it"
            " (check the mode, owner and mount of the file and its directory)"
        )
    if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        return DatabaseUnusable(f"{location} is locked by another program ({exc}); stop it first")
    return DatabaseUnusable(f"{location} cannot be opened: {exc}")


async def refuse_foreign(db: aiosqlite.Connection, location: str) -> None:
    """Another program's database is not tidal's to take: a file that holds tables and
    no tidal schema (``user_version`` 0) is refused, before anything is written to it
    (``--db app.db`` once added 22 tables to an application's database)."""
    ((version,),) = await db.execute_fetchall("PRAGMA user_version")
    if version:
        return
    rows = await db.execute_fetchall(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite%'"
        " ORDER BY name LIMIT 4"
    )
    if rows:
        names = ", ".join(str(name) for (name,) in list(rows)[:3])
        more = ", ..." if len(list(rows)) > 3 else ""
        raise DatabaseUnusable(
            f"{location} holds another program's tables ({names}{more}) and no tidal schema;"
            " tidal writes nothing to it: give --db a new file, or one tidal made"
        )


async def migrate(db: aiosqlite.Connection, location: str) -> None:
    ((version,),) = await db.execute_fetchall("PRAGMA user_version")
    if version > SCHEMA_VERSION:
        raise DatabaseUnusable(
            f"{location} has schema version {version}, newer than this tidal understands"
            f" ({SCHEMA_VERSION}): it was written by a newer tidal; run that version, or restore"
            " a backup taken before the upgrade"
        )
    # a new file is made at the current schema in one transaction; an older one steps up a
    # version at a time, each step committed with its version
    for first, last in spans(version, SCHEMA_VERSION):
        await db.execute("BEGIN IMMEDIATE")
        try:
            for step in MIGRATIONS[first:last]:
                for statement in step:
                    await db.execute(statement)
            await db.execute(f"PRAGMA user_version = {last}")
            await db.execute("COMMIT")
        except BaseException:
            await db.execute("ROLLBACK")
            raise
    told("database", version, SCHEMA_VERSION)

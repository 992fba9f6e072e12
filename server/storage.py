"""SQLite storage through aiosqlite: schema, migrations, the boot load and the group commit.

One connection, one writer: every batch is one transaction, whatever number of
requests and connections it carries. SQLite's INTEGER is signed 64-bit, so user
ids (unsigned 64-bit on the wire) are stored in two's complement.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, cast

import aiosqlite
import msgpack

from .batch import Batch, CountsRead, Writes

log = logging.getLogger("tidal.storage")

Durability = Literal["full", "normal"]

_U64: Final = 2**64
_I64_MAX: Final = 2**63 - 1

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
            context BLOB
        )""",
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
]
SCHEMA_VERSION: Final = len(MIGRATIONS)

_INSERT_LEDGER: Final = (
    "INSERT INTO ledger (seq, user_id, entity, kind, weight, ts_ns, forwarded, context)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_UPSERT_AGGREGATE: Final = (
    "INSERT INTO aggregates (entity, layer, key, kind, count, weight) VALUES (?, ?, ?, ?, ?, ?)"
    " ON CONFLICT DO UPDATE SET count = count + excluded.count, weight = weight + excluded.weight"
)
_SELECT_COUNTS: Final = """
    SELECT layer, key, kind, count, weight FROM aggregates
    WHERE entity = ? ORDER BY layer, key, kind"""
_UPSERT_MEMBERSHIP: Final = (
    "INSERT INTO memberships (user_id, left, left_at_ns) VALUES (?, ?, ?)"
    " ON CONFLICT DO UPDATE SET left = excluded.left, left_at_ns = excluded.left_at_ns"
)
_UPSERT_COHORT: Final = (
    "INSERT INTO cohorts (id, name, predicate) VALUES (?, ?, ?)"
    " ON CONFLICT (name) DO UPDATE SET id = excluded.id, predicate = excluded.predicate"
)


def to_db(user_id: int) -> int:
    return user_id - _U64 if user_id > _I64_MAX else user_id


def from_db(value: int) -> int:
    return value + _U64 if value < 0 else value


class StorageFailure(Exception):
    """A commit did not happen. ``transient`` failures (a full disk) may pass; others latch."""

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the server needs in memory before it accepts a connection."""

    memberships: list[tuple[int, bool, int]]
    cohorts: list[tuple[int, str, Any]]
    next_seq: int
    next_cohort_id: int


class Storage:
    def __init__(self, db: aiosqlite.Connection, path: str) -> None:
        self._db = db
        self.path = path
        self.commits = 0

    @classmethod
    async def open(cls, path: str | Path, durability: Durability = "full") -> Storage:
        if durability not in ("full", "normal"):
            raise ValueError(f"durability: must be 'full' or 'normal', got {durability!r}")
        db = await aiosqlite.connect(str(path), isolation_level=None)
        try:
            await db.execute("PRAGMA journal_mode=WAL")
            await db.execute(f"PRAGMA synchronous={durability.upper()}")
            await db.execute("PRAGMA foreign_keys=OFF")
            await _migrate(db)
        except BaseException:
            await db.close()
            raise
        return cls(db, str(path))

    async def load(self) -> Snapshot:
        db = self._db
        members = [
            (from_db(uid), bool(left), at)
            for uid, left, at in await db.execute_fetchall(
                "SELECT user_id, left, left_at_ns FROM memberships"
            )
        ]
        cohorts = [
            (cid, name, msgpack.unpackb(blob, raw=False))
            for cid, name, blob in await db.execute_fetchall(
                "SELECT id, name, predicate FROM cohorts ORDER BY id"
            )
        ]
        ((max_seq,),) = await db.execute_fetchall("SELECT COALESCE(MAX(seq), 0) FROM ledger")
        rows = list(
            await db.execute_fetchall("SELECT value FROM meta WHERE key = 'next_cohort_id'")
        )
        next_cohort_id = int(rows[0][0]) if rows else 1
        return Snapshot(members, cohorts, int(max_seq) + 1, next_cohort_id)

    async def commit(self, batch: Batch) -> None:
        """Run the batch's steps in order inside one transaction, then COMMIT.

        A batch that changes nothing (reads only) runs without a transaction and
        costs no fsync.
        """
        db = self._db
        writing = batch.writes > 0
        try:
            if writing:
                await db.execute("BEGIN IMMEDIATE")
            for step in batch.steps:
                if type(step) is Writes:
                    if step.ledger:
                        await db.executemany(_INSERT_LEDGER, step.ledger)
                    if step.deltas:
                        await db.executemany(
                            _UPSERT_AGGREGATE,
                            [(*key, c, w) for key, (c, w) in step.deltas.items()],
                        )
                else:
                    assert type(step) is CountsRead
                    rows = await db.execute_fetchall(_SELECT_COUNTS, (step.entity,))
                    step.rows = cast(list[tuple[int, int | str, str, int, float]], list(rows))
            if batch.memberships:
                await db.executemany(
                    _UPSERT_MEMBERSHIP,
                    [(to_db(u), int(left), at) for u, (left, at) in batch.memberships.items()],
                )
            if batch.cohorts:
                await self._write_cohorts(batch)
            if writing:
                await db.execute("COMMIT")
                self.commits += 1
        except sqlite3.Error as exc:
            await self._rollback()
            code = getattr(exc, "sqlite_errorcode", None)
            raise StorageFailure(
                f"commit failed: {exc}", transient=code == sqlite3.SQLITE_FULL
            ) from exc

    async def _write_cohorts(self, batch: Batch) -> None:
        db = self._db
        dropped = [(name,) for name, c in batch.cohorts.items() if c is None]
        defined = [
            (c.id, c.name, msgpack.packb(c.predicate, use_bin_type=True))
            for c in batch.cohorts.values()
            if c is not None
        ]
        if dropped:
            await db.executemany("DELETE FROM cohorts WHERE name = ?", dropped)
        if defined:
            await db.executemany(_UPSERT_COHORT, defined)
        if batch.next_cohort_id is not None:
            await db.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('next_cohort_id', ?)",
                (batch.next_cohort_id,),
            )

    async def _rollback(self) -> None:
        with contextlib.suppress(sqlite3.Error):  # none was open, or SQLite rolled it back
            await self._db.execute("ROLLBACK")

    async def close(self) -> None:
        await self._db.close()


async def _migrate(db: aiosqlite.Connection) -> None:
    ((version,),) = await db.execute_fetchall("PRAGMA user_version")
    if version > SCHEMA_VERSION:
        raise RuntimeError(
            f"database schema version {version} is newer than this tidal ({SCHEMA_VERSION});"
            " upgrade tidal"
        )
    for target in range(version, SCHEMA_VERSION):
        await db.execute("BEGIN IMMEDIATE")
        try:
            for statement in MIGRATIONS[target]:
                await db.execute(statement)
            await db.execute(f"PRAGMA user_version = {target + 1}")
            await db.execute("COMMIT")
        except BaseException:
            await db.execute("ROLLBACK")
            raise
        log.info("database schema migrated to version %d", target + 1)

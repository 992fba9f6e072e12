"""The two plan runners, each on its real database, with no server: an operation a runner
does not know is an error that rolls its transaction back, never a COMMIT."""

from __future__ import annotations

import contextlib
import sqlite3
from typing import Any, NamedTuple

import asyncpg
import pytest

from tidal.server.storage.postgres import execute
from tidal.server.storage.sqlbulk import Begin, Commit, Exec, Plan
from tidal.server.storage.sqlite import sqlite_storage

from .conftest import Database

pytestmark = pytest.mark.both_backends


class Foreign(NamedTuple):
    """An operation of a kind no runner knows, as a new one forgotten by a runner would be."""

    sql: str


def written_then(op: Any) -> Plan[None]:
    """A row written, then ``op`` where a plan's COMMIT would be."""
    yield Begin()
    yield Exec("INSERT INTO t (v) VALUES (?)", (1,))
    yield op


async def run_on(database: Database, plan: Plan[Any]) -> Any:
    if database.backend == "sqlite":
        with contextlib.closing(sqlite3.connect(database.target, isolation_level=None)) as db:
            return sqlite_storage.run(db, plan)
    conn = await asyncpg.connect(database.target)
    try:
        return await execute.run(conn, execute.BatchIds(), plan)
    finally:
        await conn.close()


async def test_an_operation_the_runner_does_not_know_rolls_back(database: Database) -> None:
    if database.backend == "sqlite":
        with contextlib.closing(sqlite3.connect(database.target)) as db:
            db.execute("CREATE TABLE t (v INTEGER)")
            db.commit()
    else:
        conn = await asyncpg.connect(database.target)
        try:  # a commit writes its batch id in meta (``execute.move_batch_id``)
            await conn.execute("CREATE TABLE t (v INTEGER)")
            await conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value BIGINT NOT NULL)")
        finally:
            await conn.close()

    with pytest.raises(TypeError, match="no kind of storage operation"):
        await run_on(database, written_then(Foreign("COMMIT")))
    assert await database.rows("SELECT v FROM t") == []

    # the same plan with a COMMIT the runner knows writes its row: the test can fail
    await run_on(database, written_then(Commit()))
    assert await database.rows("SELECT v FROM t") == [(1,)]

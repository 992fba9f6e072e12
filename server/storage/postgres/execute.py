"""A plan run on one asyncpg connection, statement by statement: the same plans as
SQLite's (``tidal.server.storage.plans``), each transaction stamped with a batch id."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any, TypeVar

import asyncpg

from tidal.server.storage.sqlbulk import (
    SET_META,
    Begin,
    Changed,
    Exec,
    Fill,
    Many,
    Plan,
    Put,
    Rows,
    Try,
)

from .session import LOST, STATEMENT_TIMEOUT, numbered, try_rows, unnest

T = TypeVar("T")


class CommitLost(Exception):
    """The connection was lost while COMMIT was on its way: it may or may not have happened."""


@dataclass(slots=True)
class BatchIds:
    """Each transaction writes a batch id (``meta.batch_id``): the last one this server
    committed fences a reconnect, and settles a COMMIT whose answer was lost."""

    last_id: int | None = None
    next_id: int = field(default_factory=lambda: secrets.randbits(62))  # no other server's


async def run(
    conn: asyncpg.Connection,
    ids: BatchIds,
    plan: Plan[T],
    timeout: float | None = STATEMENT_TIMEOUT,
) -> T:
    """A plan, statement by statement, each but COMMIT within ``timeout``; a transaction
    it began and did not commit is rolled back, as the database does when the session
    ends. A statement that times out closes its connection: a later one may not wait
    behind it, and the next commit reconnects."""
    in_transaction = False
    result: Any = None
    t = timeout
    try:
        while True:
            op = plan.send(result)
            result = None
            if isinstance(op, Put):
                if op.rows:
                    columns = zip(*op.rows, strict=True)
                    await conn.execute(unnest(op.bulk), *columns, timeout=t)
            elif isinstance(op, Try):
                result = await try_rows(conn, op, t)
            elif isinstance(op, Rows):
                rows = await conn.fetch(numbered(op.sql), *op.args, timeout=t)
                result = [tuple(row) for row in rows]
            elif isinstance(op, Exec):
                await conn.execute(numbered(op.sql), *op.args, timeout=t)
            elif isinstance(op, Many):
                await conn.executemany(numbered(op.sql), op.rows, timeout=t)
            elif isinstance(op, Changed):
                status = await conn.execute(numbered(op.sql), *op.args, timeout=t)
                result = int(status.rsplit(" ", 1)[1])
            elif isinstance(op, Fill):
                rows = await conn.fetch(numbered(op.sql), *op.args, timeout=t)
                op.into.update({row[0]: row[1] for row in rows})
            elif isinstance(op, Begin):
                await conn.execute("BEGIN", timeout=t)
                in_transaction = True
            else:
                ids.next_id += 1
                await conn.execute(numbered(SET_META), "batch_id", ids.next_id, timeout=t)
                in_transaction = False
                try:
                    await conn.execute("COMMIT")
                except LOST as exc:
                    if conn.is_closed():
                        raise CommitLost(str(exc)) from exc
                    raise
                ids.last_id = ids.next_id
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    except TimeoutError:
        conn.terminate()  # the session ends, and the transaction with it
        raise
    except BaseException:
        if in_transaction and not conn.is_closed():
            try:
                await conn.execute("ROLLBACK", timeout=t)
            except Exception:  # the session is gone, and its transaction with it
                conn.terminate()
        raise

"""A plan run on one asyncpg connection, statement by statement: the same plans as
SQLite's (``tidal.server.storage.plans``), each transaction stamped with a batch id."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import asyncpg

from tidal.server.storage.sqlbulk import (
    Begin,
    Changed,
    Commit,
    Exec,
    Fill,
    Many,
    Plan,
    Put,
    Rows,
    Try,
    Turn,
    unknown,
)

from .session import STATEMENT_TIMEOUT, numbered, try_rows, unnest

T = TypeVar("T")

#: a statement or COMMIT unanswered this long has the database asked, on a new session,
#: whether it answers at all (``Alive``), and again at doubling intervals up to
#: ``PATIENCE_MAX``. A path gone silent (a hung pgbouncer, HAProxy or load balancer that
#: keeps both connections open: TCP sees nothing wrong) ends the session then; a database
#: that is only slow (a COMMIT waiting for a synchronous standby) is waited for
PATIENCE: Final = 1.0
PATIENCE_MAX: Final = 8.0
#: whether the database answers anything on a new session within a few seconds
Alive = Callable[[], Awaitable[bool]]


class Silent(OSError):
    """Neither the statement nor a new session got an answer: the path to the database is
    silent. The session is ended; a COMMIT's outcome is settled by its batch id."""


async def answered(
    conn: asyncpg.Connection, call: Awaitable[T], alive: Alive | None, *, shield: bool = False
) -> T:
    """``call``'s answer on ``conn``; once neither ``call`` nor the database on a new session
    answers, ``conn`` is ended and ``call`` fails with it: its error (``CommitLost`` if it
    was in COMMIT), or ``Silent``. ``shield``: the caller's cancellation (a shutdown's
    timeout) stops the wait, not ``call`` (a COMMIT is never cancelled: ``commit``)."""
    if alive is None and not shield:
        return await call
    task = asyncio.ensure_future(call)
    try:
        patience = PATIENCE
        waited = 0.0
        while alive is not None and not (await asyncio.wait({task}, timeout=patience))[0]:
            waited += patience
            if not await alive():
                conn.terminate()  # not a cancel: the session ends, and what it was doing
                silent = (
                    f"no answer in {waited:g} s, and none on a new session either: the path to"
                    " the database is silent"
                )
                try:
                    return await task  # it fails at once, or its answer had just come
                except CommitLost as exc:
                    lost = CommitLost(f"COMMIT: {silent}")
                    lost.silent = True
                    raise lost from exc
                except Exception as exc:
                    raise Silent(silent) from exc
            patience = min(PATIENCE_MAX, patience * 2)
        return await (asyncio.shield(task) if shield else task)
    except asyncio.CancelledError:
        if not shield:
            task.cancel()
        raise


class CommitLost(Exception):
    """The connection was lost while COMMIT was on its way: it may or may not have happened.
    ``silent``: tidal ended it, the path to the database having gone silent (``answered``)."""

    silent = False


class CommitUnreplicated(Exception):
    """The COMMIT's wait for a synchronous standby was cancelled by someone else
    (``pg_cancel_backend`` on tidal's session, a database shutting down fast, as Patroni's
    switchover does): PostgreSQL then returns it as committed, with a WARNING, on the
    primary alone. It is settled as a lost answer is, by its batch id, and only once a
    later synchronous commit has returned (``barrier``): a failover may lose it before."""


class Fenced(Exception):
    """The database's batch id is not the one this server committed last: another tidal
    has written since (it took over while this one was paused or cut off)."""


#: The fence, in the transaction itself: the batch id moves from this server's last to its
#: next only if it is still this server's last. The row lock it takes makes a concurrent
#: writer wait, then see the new id and match nothing: of two tidals that both believe
#: they serve the database, one commits, the other rolls back.
_NEXT_ID: Final = "UPDATE meta SET value = $1 WHERE key = $3 AND value = $2"
_FIRST_ID: Final = "INSERT INTO meta (key, value) VALUES ($2, $1) ON CONFLICT (key) DO NOTHING"


@dataclass(slots=True)
class BatchIds:
    """Each transaction writes a batch id (``meta.batch_id``): the last one this server
    committed fences a reconnect, and settles a COMMIT whose answer was lost."""

    last_id: int | None = None
    next_id: int = field(default_factory=lambda: secrets.randbits(62))  # no other server's
    #: its row in ``meta``: ``batch_id``, or in cluster mode ``batch_id:NODE``, each node's own
    key: str = "batch_id"


async def commit(conn: asyncpg.Connection, alive: Alive | None = None) -> str | None:
    """COMMIT, never timed out nor cancelled by tidal: a COMMIT cancelled while it waits for
    a synchronous standby returns as committed on the primary alone, which a failover then
    loses. A cancelled caller (a shutdown's timeout) stops waiting; the COMMIT goes on, and
    its reply is never sent. A lost answer is settled by the batch id (``CommitLost``), and
    so is one on a path gone silent (``answered``: its session is ended, not cancelled).
    Returns the WARNING PostgreSQL sent if someone else cancelled its wait for the standby
    (``CommitUnreplicated``): its listener runs before this returns, since asyncpg schedules
    it (``call_soon``) when the notice arrives, ahead of the COMMIT's own completion."""
    unreplicated: list[str] = []

    def listen(_: object, message: asyncpg.PostgresLogMessage) -> None:
        text = str(message)
        if "synchronous replication" in text:  # syncrep.c's words: the server's language
            unreplicated.append(text)

    conn.add_log_listener(listen)
    try:
        await answered(conn, conn.execute("COMMIT"), alive, shield=True)
    except Exception as exc:
        # the server's error on a live session is its answer: no commit. A session that
        # ended meanwhile, however asyncpg says it (OSError, a FATAL from a database
        # stopped -m immediate, or "connection was closed in the middle of operation", an
        # InterfaceError), may have committed first: settled by the batch id
        gone = isinstance(exc, asyncpg.exceptions.ConnectionDoesNotExistError)
        if not (gone or conn.is_closed()):
            raise
        if not unreplicated:  # else: committed locally, the WARNING said, then cut off
            raise CommitLost(str(exc)) from exc
    finally:
        conn.remove_log_listener(listen)
    return unreplicated[0] if unreplicated else None


async def move_batch_id(
    conn: asyncpg.Connection, key: str, last: int | None, new: int, timeout: float | None
) -> None:
    """The fence (``_NEXT_ID``): ``Fenced`` if the database's batch id is not ``last``."""
    if last is None:
        status = await conn.execute(_FIRST_ID, new, key, timeout=timeout)
    else:
        status = await conn.execute(_NEXT_ID, new, last, key, timeout=timeout)
    if not status.endswith(" 1"):
        raise Fenced(
            "another tidal has committed to this database since this one's last commit (it"
            " took over while this one was paused or cut off)"
        )


async def barrier(
    conn: asyncpg.Connection, key: str, batch_id: int, alive: Alive | None = None
) -> None:
    """A synchronous commit after a batch's: a standby acknowledges WAL by position, so once
    this one returns, the standbys hold every commit before it. It rewrites the batch id,
    fenced as every transaction is (``Fenced`` if it is no longer ``batch_id``)."""
    await conn.execute("BEGIN", timeout=STATEMENT_TIMEOUT)
    try:
        await move_batch_id(conn, key, batch_id, batch_id, STATEMENT_TIMEOUT)
    except BaseException:
        if not conn.is_closed():
            await conn.execute("ROLLBACK", timeout=STATEMENT_TIMEOUT)
        raise
    warning = await commit(conn, alive)
    if warning is not None:
        raise CommitUnreplicated(warning)


async def run(
    conn: asyncpg.Connection,
    ids: BatchIds,
    plan: Plan[T],
    timeout: float | None = STATEMENT_TIMEOUT,
    alive: Alive | None = None,
) -> T:
    """A plan, statement by statement, each but COMMIT within ``timeout``, and none on a
    path gone silent for longer than it takes to notice (``alive``: see ``answered``); a
    transaction it began and did not commit is rolled back, as the database does when the
    session ends. A statement that times out closes its connection: a later one may not
    wait behind it, and the next commit reconnects."""
    return await answered(conn, _run(conn, ids, plan, timeout), alive)


async def _run(conn: asyncpg.Connection, ids: BatchIds, plan: Plan[T], t: float | None) -> T:
    in_transaction = False
    result: Any = None
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
            elif isinstance(op, Commit):
                ids.next_id += 1
                await move_batch_id(conn, ids.key, ids.last_id, ids.next_id, t)
                in_transaction = False
                warning = await commit(conn)
                if warning is not None:
                    raise CommitUnreplicated(warning)
                ids.last_id = ids.next_id
            elif isinstance(op, Turn):
                await asyncio.sleep(0)  # the others' turn: plans run on the loop here
            else:  # a kind this runner does not know: never taken for a COMMIT
                unknown(op)
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

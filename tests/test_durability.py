"""Acknowledged means durable: group commit, read-after-write, kill -9, failed commits."""

from __future__ import annotations

import asyncio
import contextlib
import io
import random
import signal
import sqlite3
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest

from tidal.client import Client, ConnectionLost, Signal, Unavailable
from tidal.server import Config, Server
from tidal.server.core.batch import Batch
from tidal.server.errors import DatabaseUnusable, StorageFailure
from tidal.server.storage.sqlite.sqlite_schema import SCHEMA_VERSION

from .conftest import Database, ServerProcess

pytestmark = pytest.mark.both_backends


def wrap_commit(
    server: Server, around: Callable[[Callable[[Batch], Awaitable[None]], Batch], Awaitable[None]]
) -> None:
    """Fault injection: route the server's commits through ``around``."""
    storage = server._storage
    assert storage is not None
    real = storage.commit

    async def commit(transaction: Any) -> None:  # the batch's (``engine.cycle``)
        await around(lambda batch: real(transaction), transaction.batch)

    storage.commit = commit  # type: ignore[method-assign]


def fail_once(server: Server, when: Callable[[Batch], bool]) -> None:
    """Fault injection: the first commit of a batch ``when`` picks fails as a full disk does."""
    failures = [StorageFailure("database or disk is full", transient=True)]

    async def flaky(real: Callable[[Batch], Awaitable[None]], batch: Batch) -> None:
        if when(batch) and failures:
            raise failures.pop()
        await real(batch)

    wrap_commit(server, flaky)


async def test_writes_from_many_connections_share_commits(server: Server) -> None:
    host, port = server.address
    clients = [await Client.connect(host, port) for _ in range(20)]
    try:
        acks = await asyncio.gather(
            *(c.signal(i, "shared", "view") for i in range(50) for c in clients)
        )
        stats = await clients[0].stats()
    finally:
        for c in clients:
            await c.close()
    assert len({a.seq for a in acks}) == 1000
    assert stats["signals"] == 1000
    # one commit per request would be 1000; group commit takes a few dozen at most
    assert stats["commits"] <= 100, stats


async def test_a_read_waits_for_the_commit_of_a_write_it_can_see(server: Server) -> None:
    release = asyncio.Event()
    entered = asyncio.Event()

    async def held(real: Callable[[Batch], Awaitable[None]], batch: Batch) -> None:
        if batch.writes:
            entered.set()
            await release.wait()
        await real(batch)

    wrap_commit(server, held)
    host, port = server.address
    async with await Client.connect(host, port) as a, await Client.connect(host, port) as b:
        assert (await b.status(8)).status == "active"  # nothing pending: answered at once
        leave = asyncio.create_task(a.leave(8))
        await entered.wait()
        status = asyncio.create_task(b.status(8))
        ping = await b.ping()  # reveals nothing, so it is not held back
        assert ping == "pong"
        assert not leave.done() and not status.done()
        release.set()
        assert (await status).status == "left"
        assert (await leave).status == "left"


async def test_counts_answers_with_what_is_committed_while_a_commit_is_held(
    server: Server,
) -> None:
    """Read beside the writer: another connection's counts does not wait for a commit, and
    shows none of its signals; the writer's own counts waits, and shows its own."""
    release = asyncio.Event()
    entered = asyncio.Event()

    async def held(real: Callable[[Batch], Awaitable[None]], batch: Batch) -> None:
        if batch.writes and not release.is_set():
            entered.set()
            await release.wait()
        await real(batch)

    host, port = server.address
    async with await Client.connect(host, port) as a, await Client.connect(host, port) as b:
        await a.signal(1, "e", "view", communities=["c"])
        wrap_commit(server, held)
        signal = asyncio.create_task(a.signal(2, "e", "view", communities=["c"]))
        await entered.wait()
        seen = await asyncio.wait_for(b.counts("e"), 5)  # while the commit is held
        assert seen.ledger["view"].count == 1
        assert seen.communities["c"]["view"].count == 1
        own = asyncio.create_task(a.counts("e"))
        assert await a.ping() == "pong"  # read after the counts: the counts was read too
        assert not own.done() and not signal.done()
        release.set()
        assert (await own).ledger["view"].count == 2
        assert (await signal).forwarded
        assert (await b.counts("e")).communities["c"]["view"].count == 2


async def test_a_transient_commit_failure_refuses_and_forgets_the_writes(server: Server) -> None:
    fail_once(server, lambda batch: bool(batch.writes))
    host, port = server.address
    async with await Client.connect(host, port) as c:
        with pytest.raises(Unavailable, match="disk is full"):
            await c.leave(21)
        # memory was put back: the leave never happened
        assert (await c.status(21)).status == "active"
        first = await c.signal(21, "e", "view", communities=["c"])
        assert first.forwarded
        assert first.seq == 1  # the refused batch's seqs were never used
        assert (await c.leave(21)).status == "left"  # and writes work again
        assert (await c.counts("e")).communities["c"]["view"].count == 1


async def test_a_refused_cohort_drop_read_during_another_cohort_change_keeps_its_counts(
    server: Server,
) -> None:
    """A batch with a cohort change commits while the batch after it, already holding a drop
    of another cohort, waits; that drop is then refused (a full disk). The cohort is still
    defined, and must keep its counts: the first commit took its tallies off the board, as
    it judged what was dropped by the cohorts in memory, the refused drop among them (the
    fault-history checker found a cohort's counts below a recompute after full disks)."""
    release = asyncio.Event()
    entered = asyncio.Event()
    refused = [StorageFailure("database or disk is full", transient=True)]

    async def around(real: Callable[[Batch], Awaitable[None]], batch: Batch) -> None:
        if "de" in batch.cohorts and not release.is_set():
            entered.set()
            await release.wait()  # held: the drop below is read meanwhile, into the next
        elif "fr" in batch.cohorts and batch.cohorts["fr"] is None and refused:
            raise refused.pop()
        await real(batch)

    host, port = server.address
    async with await Client.connect(host, port) as a, await Client.connect(host, port) as b:
        assert await a.define_cohort("fr", {"country": "FR"})
        await a.signal(1, "e", "view", attrs={"country": "FR"})
        wrap_commit(server, around)
        define = asyncio.create_task(a.define_cohort("de", {"country": "DE"}))
        await entered.wait()
        drop = asyncio.create_task(b.drop_cohort("fr"))
        assert await b.ping() == "pong"  # read after the drop: the drop was read too
        release.set()
        assert await define
        with pytest.raises(Unavailable, match="disk is full"):
            await drop
        assert "fr" in await b.cohorts()
        assert (await b.counts("e")).cohorts["fr"]["view"].count == 1
        await b.signal(2, "e", "view", attrs={"country": "FR"})
        assert (await b.counts("e")).cohorts["fr"]["view"].count == 2


async def test_a_hard_commit_failure_refuses_writes_but_serves_reads(server: Server) -> None:
    async def broken(real: Callable[[Batch], Awaitable[None]], batch: Batch) -> None:
        if batch.writes:
            raise StorageFailure("disk I/O error", transient=False)
        await real(batch)

    host, port = server.address
    async with await Client.connect(host, port) as c:
        await c.leave(1)
        wrap_commit(server, broken)
        with pytest.raises(Unavailable, match="disk I/O error"):
            await c.rejoin(1)
        with pytest.raises(Unavailable, match="refused until the server is restarted"):
            await c.signal(1, "e", "view")
        assert (await c.status(1)).status == "left"
        assert (await c.stats())["storage"] == "failed"
        assert await c.ping() == "pong"


async def test_kill_9_loses_no_acknowledged_write(
    process: ServerProcess, database: Database
) -> None:
    await process.start()
    rng = random.Random(4)
    acked_signals: dict[str, int] = {}
    sent_signals: dict[str, int] = {}
    state: dict[int, str] = {}  # last acknowledged membership per user
    killed = asyncio.Event()
    enough = asyncio.Event()

    async def worker(c: Client, n: int) -> None:
        try:
            for i in range(10_000):
                if killed.is_set():
                    return
                user = rng.randrange(50)
                if i % 7 == 3:
                    state[user] = (await c.leave(user)).status
                elif i % 7 == 5:
                    state[user] = (await c.rejoin(user)).status
                else:
                    entity = f"e{n}"
                    sent_signals[entity] = sent_signals.get(entity, 0) + 1
                    await c.signal(user, entity, "view")
                    acked_signals[entity] = acked_signals.get(entity, 0) + 1
                    if sum(acked_signals.values()) >= 300:
                        enough.set()
        except ConnectionLost:
            return

    clients = [await process.connect() for _ in range(4)]
    workers = [asyncio.create_task(worker(c, n)) for n, c in enumerate(clients)]
    await asyncio.wait_for(enough.wait(), 60)
    await process.kill9()
    killed.set()
    await asyncio.gather(*workers)
    for c in clients:
        await c.close()

    await process.start()
    async with await process.connect() as c:
        for user, status in state.items():
            assert (await c.status(user)).status == status, user
        for entity, acked in acked_signals.items():
            ledger = (await c.counts(entity)).ledger
            count = ledger["view"].count if ledger else 0
            assert acked <= count <= sent_signals[entity], entity
    if database.backend == "sqlite":
        with contextlib.closing(sqlite3.connect(database.target)) as db:
            assert db.execute("PRAGMA quick_check").fetchone() == ("ok",)


async def test_sigterm_under_load_answers_what_it_read_and_exits_0(
    process: ServerProcess,
) -> None:
    await process.start()
    idle = await process.connect()
    busy = [await process.connect() for _ in range(4)]
    calls: list[asyncio.Future[Any]] = [
        asyncio.ensure_future(c.signal(i, "term", "view")) for i in range(1000) for c in busy
    ]
    calls += [
        asyncio.ensure_future(c.signal_batch([Signal(1, "term", "view")] * 500)) for c in busy
    ]
    await asyncio.wait(calls, return_when=asyncio.FIRST_COMPLETED)
    assert process.proc is not None
    process.proc.send_signal(signal.SIGTERM)
    began = time.monotonic()
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert await process.wait() == 0, b"".join(process.log).decode()
    assert time.monotonic() - began < 5
    assert not idle.is_connected  # the server closed the idle client itself
    for c in [idle, *busy]:
        await c.close()
    acked = [r for r in results if not isinstance(r, BaseException)]
    lost = [r for r in results if isinstance(r, BaseException)]
    assert all(isinstance(e, ConnectionLost) for e in lost), lost[:3]
    assert acked
    acked_signals = sum(len(r) if isinstance(r, list) else 1 for r in acked)
    await process.start()
    async with await process.connect() as c:
        assert (await c.counts("term")).ledger["view"].count == acked_signals


async def test_schema_is_versioned(db_path: Path) -> None:
    server = Server(Config(port=0, db=str(db_path)))
    await server.start()
    await server.shutdown()
    with sqlite3.connect(db_path) as db:
        assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(DatabaseUnusable, match="newer than this tidal"):
        await Server(Config(port=0, db=str(db_path))).start()


async def test_a_client_that_half_closes_gets_every_answer(server: Server) -> None:
    """[ping, signal, leave, status], then shutdown(SHUT_WR): all four are answered."""
    reader, writer = await asyncio.open_connection(*server.address)
    for msgid, (method, params) in enumerate(
        [("ping", []), ("signal", [9, "half", "view"]), ("leave", [9]), ("status", [9])]
    ):
        writer.write(msgpack.packb([0, msgid, method, params]))
    writer.write_eof()
    replies = list(msgpack.Unpacker(io.BytesIO(await asyncio.wait_for(reader.read(), 10))))
    writer.close()
    assert [r[1] for r in sorted(replies, key=lambda r: r[1])] == [0, 1, 2, 3], replies
    by_id = {r[1]: r for r in replies}
    assert by_id[1][3]["forwarded"] is True and by_id[2][3]["status"] == "left"
    assert by_id[3][3]["status"] == "left"
    async with await Client.connect(*server.address) as c:
        assert (await c.counts("half")).ledger["view"].count == 1

"""A retried write is safe: a signal's idempotency key is counted once, even across restarts."""

from __future__ import annotations

import asyncio
import socket
import sqlite3
import statistics
import time
from pathlib import Path

import pytest

from tidal.client import Client, InvalidParams, Signal
from tidal.server import Config, Server
from tidal.server.storage.sqlite.sqlite_schema import MIGRATIONS, SCHEMA_VERSION

from .conftest import Database, ServerProcess

pytestmark = pytest.mark.both_backends


@pytest.mark.through_cluster
async def test_a_repeated_key_gets_the_first_ack_and_counts_once(client: Client) -> None:
    first = await client.signal(1, "song", "view", communities=["c"], key="req-1")
    again = await client.signal(1, "song", "view", communities=["c"], key="req-1")
    other = await client.signal(1, "song", "view", communities=["c"], key="req-2")
    assert again == first and other.seq != first.seq
    counts = await client.counts("song")
    assert counts.ledger["view"].count == 2 and counts.communities["c"]["view"].count == 2
    acks = await client.signal_batch([Signal(1, "song", "view", key=k) for k in ("req-2", "b-1")])
    assert acks[0] == other
    assert (await client.counts("song")).ledger["view"].count == 3
    assert (await client.stats())["signals"] == 3


@pytest.mark.through_cluster
async def test_a_repeat_while_the_first_is_uncommitted_waits_and_matches(client: Client) -> None:
    acks = await asyncio.gather(*(client.signal(2, "e", "view", key="same") for _ in range(50)))
    assert len(set(acks)) == 1
    assert (await client.counts("e")).ledger["view"].count == 1


async def test_keys_hold_across_a_restart(process: ServerProcess) -> None:
    await process.start()
    async with await process.connect() as c:
        first = await c.signal(3, "e", "view", key="before-restart")
    await process.kill9()
    await process.start()
    async with await process.connect() as c:
        assert await c.signal(3, "e", "view", key="before-restart") == first
        assert (await c.counts("e")).ledger["view"].count == 1


async def test_keys_are_forgotten_past_the_window_or_the_cap(database: Database) -> None:
    now = time.time_ns()
    server = Server(Config(port=0, db=database.target, idempotency_window=0.3), clock=lambda: now)
    await server.start()
    try:
        async with await Client.connect(*server.address) as c:
            first = await c.signal(4, "e", "view", key="k")
            now += 200_000_000
            assert (await c.signal(4, "e", "view", key="k")).seq == first.seq  # within it
            now += 200_000_000  # the window of 0.3 s has passed
            assert (await c.signal(4, "e", "view", key="k")).seq != first.seq
    finally:
        await server.shutdown()
    server = Server(Config(port=0, db=database.target, idempotency_max_keys=2))
    await server.start()
    try:
        async with await Client.connect(*server.address) as c:
            a = await c.signal(5, "e", "view", key="a")
            await c.signal(5, "e", "view", key="b")
            await c.signal(5, "e", "view", key="c")  # the cap is 2: "a" is forgotten
            assert (await c.signal(5, "e", "view", key="a")).seq != a.seq
    finally:
        await server.shutdown()


@pytest.mark.parametrize(
    ("key", "fragment"),
    [("", "context.id: must be 1..64"), ("x" * 65, "got 65"), (7, "must be a string")],
)
async def test_keys_are_validated(client: Client, key: object, fragment: str) -> None:
    with pytest.raises(InvalidParams, match=fragment):
        await client.call("signal", 1, "e", "view", 1.0, {"id": key})


async def test_the_client_retries_keyed_signals_across_a_crash(database: Database) -> None:
    with socket.socket() as s:  # a fixed port, so the restarted server is found again
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = ServerProcess(database.target, "--port", str(port))
    await process.start()
    client = await Client.connect("127.0.0.1", port, auto_keys=True, timeout=10)
    acked: list[int] = []
    halfway = asyncio.Event()

    async def load() -> None:
        for i in range(400):
            acked.append((await client.signal(i, "retry", "view")).seq)
            if i == 150:
                halfway.set()

    loading = asyncio.create_task(load())
    await halfway.wait()
    await process.kill9()
    await process.start()
    await loading  # every call returned an acknowledgement, across the crash
    await client.close()
    assert len(acked) == len(set(acked)) == 400
    await process.stop()
    ((rows,),) = await database.rows("SELECT COUNT(*) FROM ledger WHERE entity = 'retry'")
    assert rows == 400  # none lost, none counted twice


def test_a_version_1_database_is_migrated(db_path: Path) -> None:
    with sqlite3.connect(db_path) as db:
        for statement in MIGRATIONS[0]:
            db.execute(statement)
        db.execute("PRAGMA user_version = 1")

    async def boot() -> None:
        server = Server(Config(port=0, db=str(db_path)))
        await server.start()
        async with await Client.connect(*server.address) as c:
            await c.signal(1, "e", "view", key="k")
        await server.shutdown()

    asyncio.run(boot())
    with sqlite3.connect(db_path) as db:
        assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        assert db.execute("SELECT key FROM signal_keys").fetchall() == [("k",)]


async def test_keys_past_the_cap_cost_what_keys_below_it_cost(db_path: Path) -> None:
    """Evicting the oldest key must be O(1) at any size: with a plain dict it scans every
    slot deleted before the first live one, and each batch past the cap got slower."""
    cap = 100_000
    server = Server(Config(port=0, db=str(db_path), idempotency_max_keys=cap))
    await server.start()
    seconds = []
    try:
        async with await Client.connect(*server.address, timeout=60) as c:
            for b in range(18):
                batch = [Signal(i, "k", "view", key=f"{b}-{i}") for i in range(10_000)]
                began = time.perf_counter()
                await c.signal_batch(batch)
                seconds.append(time.perf_counter() - began)
    finally:
        await server.shutdown()
    below = statistics.median(seconds[1:9])  # the first pays for warming up
    past = statistics.median(seconds[-4:])  # every signal here evicts one key
    assert past < 2.5 * below, [round(s, 3) for s in seconds]

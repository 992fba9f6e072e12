"""PostgreSQL settings and faults that once wedged tidal: a database in the wrong encoding,
timeouts set on the role, a value it cannot store already on disk, a network gone silent,
a second tidal in another schema."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator

import asyncpg
import msgpack
import pytest

from tidal.client import Client, Signal, Tally, Unavailable
from tidal.server.core.ledger import COMMUNITY
from tidal.testing.postgres import Cluster

from .conftest import Database, ServerProcess
from .relay import Relay
from .test_postgres import cli, until


@pytest.fixture
def backend() -> str:
    return "postgresql"


async def execute(database: Database, sql: str) -> None:
    conn = await asyncpg.connect(database.target)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


#: a session of this test's own, as tidal's are: the database's timeouts do not reach it
UNTIMED = {
    "statement_timeout": "0",
    "lock_timeout": "0",
    "idle_in_transaction_session_timeout": "0",
}


async def checkpointed(c: Client, database: Database, seq: int) -> None:
    """Until a checkpoint holds the ledger to ``seq``: its own mark, the watermark in
    ``meta``. A checkpoint due is taken as a batch commits, so each look sends a signal
    first (to an entity of its own)."""
    conn = await asyncpg.connect(database.target, server_settings=UNTIMED)

    async def held() -> bool:
        await c.signal(0, "tick", "view")
        value = await conn.fetchval("SELECT value FROM meta WHERE key = 'aggregates_seq'")
        return value is not None and value >= seq

    try:
        await until(held)
    finally:
        await conn.close()


async def test_a_database_not_in_utf8_is_refused_in_one_line(pg_cluster: Cluster) -> None:
    admin = await asyncpg.connect(pg_cluster.url("postgres"))
    try:
        await admin.execute(
            "CREATE DATABASE latin ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"
        )
    finally:
        await admin.close()
    try:
        code, stderr = await cli("serve", "--port", "0", "--db", pg_cluster.url("latin"))
        assert code == 2, stderr
        assert "LATIN1" in stderr.strip().splitlines()[-1] and "UTF8" in stderr, stderr
        assert "Traceback" not in stderr
    finally:
        await pg_cluster.drop("latin")


async def test_timeouts_set_on_the_database_do_not_reach_tidal_s_sessions(
    database: Database,
) -> None:
    """statement_timeout of 1 ms on the database: a checkpoint of 20,000 aggregates still
    commits, and a restart replays nothing."""
    name = database.target.rsplit("/", 1)[1]
    # in one session: each applies to sessions opened after it, this test's own included
    # (a second connection's setup was cancelled by the 1 ms timeout, or hung)
    await execute(
        database,
        f"ALTER DATABASE {name} SET statement_timeout = '1ms';"
        f" ALTER DATABASE {name} SET lock_timeout = '1ms';"
        f" ALTER DATABASE {name} SET idle_in_transaction_session_timeout = '1ms'",
    )
    process = await ServerProcess(database.target, "--checkpoint-seconds", "0.2").start()
    async with await process.connect() as c:
        for start in range(0, 20_000, 2_000):
            await c.signal_batch([Signal(u, f"e{u}", "view") for u in range(start, start + 2_000)])
        await checkpointed(c, database, 20_000)
        await c.signal(1, "e1", "view")
        assert (await c.health())["status"] == "ok"
    assert await process.stop() == 0
    log = b"".join(process.log).decode()
    assert "refused" not in log and "failed" not in log, log
    again = await ServerProcess(database.target).start()
    try:
        boot = b"".join(again.log).decode()
        assert " 0 ledger rows replayed" in boot, boot
        async with await again.connect() as c:
            assert (await c.counts("e1")).ledger["view"].count == 2
    finally:
        assert await again.stop() == 0


async def test_a_nul_name_already_on_disk_boots_healthy_and_is_kept(
    database: Database,
) -> None:
    """A community name with NUL, written into a ledger row's context by a tidal that let it
    through: PostgreSQL's text refuses it, but the board is kept in msgpack (``bytea``), so
    the checkpoint commits its aggregate with the rest, and a restart reads it back."""
    first = await ServerProcess(database.target).start()
    assert await first.stop() == 0  # the tables
    context = msgpack.packb([["ja\x00zz", "rock"], {}, []], use_bin_type=True)
    conn = await asyncpg.connect(database.target)
    try:
        await conn.execute(
            "INSERT INTO ledger (seq, user_id, entity, kind, weight, ts_ns, forwarded, context)"
            " VALUES (1, 7, 'song', 'view', 1.0, 1, 1, $1)",
            context,
        )
    finally:
        await conn.close()
    process = await ServerProcess(database.target, "--checkpoint-seconds", "0.2").start()
    try:
        async with await process.connect() as c:
            await checkpointed(c, database, 1)
            await c.signal(8, "song", "view", communities=["rock"])
            assert (await c.health())["status"] == "ok"
            counts = await c.counts("song")
            assert counts.communities["rock"]["view"].count == 2
    finally:
        assert await process.stop() == 0
    log = b"".join(process.log).decode()
    assert "refused" not in log and "failed" not in log, log
    board = await database.board()
    assert board["song", COMMUNITY, "ja\x00zz", "view"] == (1, 1.0)
    assert board["song", COMMUNITY, "rock", "view"] == (2, 2.0)
    again = await ServerProcess(database.target).start()
    try:
        boot = b"".join(again.log).decode()
        assert " 0 ledger rows replayed" in boot, boot
        async with await again.connect() as c:
            communities = (await c.counts("song")).communities
            assert communities == {
                "ja\x00zz": {"view": Tally(1, 1.0)},
                "rock": {"view": Tally(2, 2.0)},
            }
    finally:
        assert await again.stop() == 0


async def test_a_tidal_per_schema_of_one_database(pg_cluster: Cluster, database: Database) -> None:
    for schema in ("one", "two"):
        await execute(database, f"CREATE SCHEMA {schema}")
    first = await ServerProcess(database.target + "?search_path=one").start()
    second = await ServerProcess(database.target + "?search_path=two").start()
    try:
        code, stderr = await cli(
            "serve", "--port", "0", "--db", database.target + "?search_path=one"
        )
        assert code == 2 and "schema one" in stderr, stderr
        async with await first.connect() as a, await second.connect() as b:
            await a.leave(5)
            assert (await b.status(5)).status == "active"  # two tidals, two databases to tidal
            assert (await b.signal(5, "e", "view", communities=["c"])).forwarded is True
    finally:
        assert await first.stop() == 0
        assert await second.stop() == 0


# -- a network that goes silent --------------------------------------------------------


@pytest.fixture
async def relay(pg_cluster: Cluster) -> AsyncIterator[Relay]:
    r = Relay(pg_cluster.port)
    await r.start()
    yield r
    await r.close()


@contextlib.contextmanager
def within(seconds: float, what: str) -> Iterator[None]:
    began = time.monotonic()
    yield
    took = time.monotonic() - began
    assert took < seconds, f"{what} took {took:.1f}s, over {seconds}s"


async def test_a_silent_network_is_noticed_within_10_seconds(
    database: Database, relay: Relay
) -> None:
    url = database.target.replace(f":{relay.target}/", f":{relay.port}/")
    process = await ServerProcess(url, "--shutdown-timeout", "20").start()
    async with await process.connect_with(reconnect=0) as c:
        await c.signal(1, "e", "view")
        relay.go_silent()
        with within(10, "a signal's error 2"), pytest.raises(Unavailable):
            await c.call("signal", 2, "e", "view", timeout=30)
        with within(10, "health"):
            health = await c.call("health", timeout=30)
        assert health["status"] == "failing" and health["storage"] == "unavailable", health
        for i in range(300):  # a client retrying while the database is away
            with contextlib.suppress(Unavailable):
                await c.call("signal", 100 + i, "e", "view", timeout=30)
        relay.speak()
        for _ in range(100):  # back by itself, with no restart (a schedule: its backoff)
            with contextlib.suppress(Unavailable):
                ack = await c.call("signal", 3, "e", "view", timeout=30)
                break
            await asyncio.sleep(0.2)
        else:
            raise AssertionError("writes never came back")
        assert ack["seq"] >= 2
        await c.signal(4, "e", "view")  # deltas a last checkpoint must write
        relay.go_silent()
    log = b"".join(process.log).decode()
    # its abandoned session: ended by tidal (named by its pid and start time) if the relay
    # kept it alive, or by the relay, once the close that tidal sent as it gave the session
    # up (the path silent) got through after the rules went; never the lock of another
    reconnected = "reconnected to" in log
    assert reconnected and "took the database" not in log, log[-2000:]
    lines = [line for line in log.splitlines() if " ERROR " in line or " WARNING " in line]
    assert len(lines) < 40, f"{len(lines)} lines for 300 refusals:\n" + "\n".join(lines[-10:])
    # SIGTERM while the database cannot be reached: the last checkpoint fails, and says so
    assert await process.stop() == 1
    assert "shutdown: the last commit failed" in b"".join(process.log).decode()


async def writes_come_back(c: Client, user: int) -> None:
    """A signal of ``user`` is taken again, with no restart (tried on tidal's backoff)."""
    for _ in range(100):
        with contextlib.suppress(Unavailable):
            await c.call("signal", user, "e", "view", timeout=30)
            return
        await asyncio.sleep(0.2)  # a schedule: its backoff, not a synchronisation
    raise AssertionError("writes never came back")


async def test_a_proxy_gone_silent_at_commit_is_noticed_and_the_commit_settled(
    database: Database, relay: Relay
) -> None:
    """The relay keeps both connections open but passes nothing on from a COMMIT: TCP sees
    a healthy socket. The request gets error 2 within 10 s, health answers at once that
    storage is unavailable, and once the relay passes bytes again the COMMIT is settled by
    its batch id on a new session: memory and the database agree (issue 39, item 2: the
    signal got no answer in 15 s, health none in 8 s)."""
    url = database.target.replace(f":{relay.target}/", f":{relay.port}/")
    process = await ServerProcess(url, "--shutdown-timeout", "20").start()
    async with await process.connect_with(reconnect=0) as c:
        await c.signal(1, "e", "view")
        relay.mute(b"COMMIT")
        with within(10, "a signal's error 2"), pytest.raises(Unavailable) as refused:
            await c.call("signal", 2, "e", "view", timeout=30)
        assert "whether this request was saved is unknown" in str(refused.value), refused.value
        with within(1, "health"):
            health = await c.call("health", timeout=30)
        assert health["status"] == "failing" and health["storage"] == "unavailable", health
        with within(1, "a write's error 2"), pytest.raises(Unavailable):
            await c.call("signal", 3, "e", "view", timeout=30)  # refused until it is known
        relay.unmute()
        await writes_come_back(c, 4)
        counted = (await c.counts("e")).ledger["view"].count
        rows = await database.rows("SELECT user_id FROM ledger ORDER BY seq")
        assert [u for (u,) in rows] in ([1, 4], [1, 2, 4]), rows
        assert counted == len(rows)
    log = b"".join(process.log).decode()
    assert "the COMMIT held" in log or "the COMMIT did not hold" in log, log[-2000:]
    assert "the path to the database is silent" in log
    assert await process.stop() == 0


async def test_a_leave_with_purge_whose_commit_was_cut_off_is_not_told_nothing_was_saved(
    database: Database, relay: Relay
) -> None:
    """A leave with purge in the batch whose COMMIT the proxy swallowed, its purge waiting
    for an earlier one's: it is answered within seconds, not once the path speaks again
    (it waited for as long as the path stayed silent), and its answer says the outcome is
    unknown, never that nothing was saved (the checker's silent relay found a leave in the
    history after such an answer)."""
    url = database.target.replace(f":{relay.target}/", f":{relay.port}/")
    process = await ServerProcess(url, "--shutdown-timeout", "20").start()
    async with await process.connect_with(reconnect=0) as c:
        await c.signal(5, "e", "view", communities=["c"])
        relay.mute(b"COMMIT")
        with within(10, "error 2 to both"):  # pipelined: the leave's purge waits for the purge
            replies: list[object] = await asyncio.gather(
                c.call("purge", 5, timeout=30),
                c.call("leave", 5, {"purge": True}, timeout=30),
                return_exceptions=True,
            )
        purged, left = replies
        assert isinstance(purged, Unavailable) and isinstance(left, Unavailable), (purged, left)
        assert "whether this request was saved is unknown" in str(left), left
        relay.unmute()
        await writes_come_back(c, 6)
        status = (await c.status(5)).status
        events = [line.event for line in await c.history(5)]
        assert events[:1] == (["leave"] if status == "left" else []), (status, events)
    assert await process.stop() == 0

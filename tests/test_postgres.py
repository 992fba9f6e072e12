"""What only the PostgreSQL backend has: its lock, its faults, its password.

The semantic suite runs on both backends (``both_backends``); these are the
promises of a database on a server: one tidal per database, the database
stopped (``pg_ctl -m immediate``) under load and started again, and a password
that never reaches a log.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg
import pytest

from tidal.client import Client, Tally, Unavailable
from tidal.testing.postgres import PASSWORD, Cluster

from .conftest import Database, ServerProcess

pytestmark = pytest.mark.parametrize("backend", ["postgresql"])


async def cli(*args: str) -> tuple[int, str]:
    """``tidal ARGS``: its exit code and what it wrote to stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tidal.cli", *args,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, stderr = await asyncio.wait_for(proc.communicate(), 30)
    return await proc.wait(), stderr.decode()


class Progress:
    """Counts that tasks wait on: ``reach(n)`` returns once the count is ``n`` or more."""

    def __init__(self) -> None:
        self.count = 0
        self._waiting: list[tuple[int, asyncio.Event]] = []

    def add(self) -> None:
        self.count += 1
        for target, event in self._waiting:
            if self.count >= target:
                event.set()

    async def reach(self, target: int) -> None:
        event = asyncio.Event()
        if self.count < target:
            self._waiting.append((target, event))
            await asyncio.wait_for(event.wait(), 60)


async def test_a_second_server_on_the_database_refuses_to_start(database: Database) -> None:
    first = await ServerProcess(database.target).start()
    try:
        code, stderr = await cli("serve", "--port", "0", "--db", database.target)
        assert code == 2, stderr
        lines = stderr.strip().splitlines()
        assert "another tidal" in lines[-1] and "advisory lock" in lines[-1], stderr
        assert "Traceback" not in stderr
        assert PASSWORD not in stderr
        async with await first.connect() as c:  # the first one is untouched
            assert (await c.signal(1, "e", "view")).seq == 1
    finally:
        assert await first.stop() == 0
    assert PASSWORD not in b"".join(first.log).decode()


async def test_the_password_can_come_from_a_file_and_is_never_logged(
    pg_cluster: Cluster, database: Database, tmp_path: Path
) -> None:
    secret = tmp_path / "pg-password"
    secret.write_text(PASSWORD + "\n")
    name = database.target.rsplit("/", 1)[1]
    url = pg_cluster.url(name, password=False)
    process = ServerProcess(url, "--db-password-file", str(secret), "--log-level", "debug")
    await process.start()
    async with await process.connect() as c:
        await c.leave(7)
        assert (await c.stats())["backend"] == "postgresql"
    assert await process.stop() == 0
    assert PASSWORD not in b"".join(process.log).decode()
    code, stderr = await cli("serve", "--port", "0", "--db", url)  # no password given
    assert code == 2  # told why, in one line
    assert "password authentication failed" in stderr.strip().splitlines()[-1]
    assert "Traceback" not in stderr


async def test_backup_of_a_postgresql_database_points_to_pg_dump(
    database: Database, tmp_path: Path
) -> None:
    code, stderr = await cli("backup", str(tmp_path / "b"), "--db", database.target)
    assert code == 2
    assert "pg_dump" in stderr and PASSWORD not in stderr


async def test_the_database_stopped_under_load_then_back(
    pg_cluster: Cluster, database: Database
) -> None:
    """``pg_ctl -m immediate`` while four clients write: writes get error 2 (never a wrong
    answer), health says so, tidal reconnects by itself once the database is back, and
    every acknowledged signal is there."""
    process = await ServerProcess(database.target).start()
    acked: dict[int, int] = {}  # seq -> user
    acks = Progress()
    errors: list[str] = []
    stop = asyncio.Event()

    async def writer(c: Client, n: int) -> None:
        i = 0
        while not stop.is_set():
            user = n * 100_000 + i
            i += 1
            try:
                ack = await c.signal(user, "e", "view", communities=["c"])
            except Unavailable as exc:
                errors.append(str(exc))
                await asyncio.sleep(0.01)  # a client's pace, not a synchronisation
                continue
            acked[ack.seq] = user
            acks.add()

    # A request in the batch whose COMMIT answer is lost waits for the outcome (up to 60 s):
    # the writers' timeout is longer, so that every request gets tidal's own answer.
    clients = [await process.connect_with(timeout=90) for _ in range(4)]
    writers = [asyncio.create_task(writer(c, n)) for n, c in enumerate(clients)]
    try:
        await acks.reach(500)
        await asyncio.to_thread(pg_cluster.stop, "immediate")
        try:
            # at once, even while every writer's request waits on a COMMIT's lost answer
            async with await process.connect() as probe:
                with pytest.raises(Unavailable, match="storage unavailable"):
                    await probe.signal(10**9, "e", "view", communities=["c"])
                health = await probe.health()
            assert health["status"] == "failing" and health["storage"] == "unavailable", health
        finally:
            await asyncio.to_thread(pg_cluster.start)
        await acks.reach(acks.count + 200)  # without a restart of tidal
        assert (await clients[0].health())["status"] == "ok"
    finally:
        stop.set()
        await asyncio.gather(*writers)
        for c in clients:
            await c.close()
    async with await process.connect() as c:
        assert (await c.counts("e")).ledger["view"].count >= len(acked)
    assert await process.stop() == 0
    rows = dict(await database.rows("SELECT seq, user_id FROM ledger"))
    missing = {seq: user for seq, user in acked.items() if rows.get(seq) != user}
    assert not missing, f"{len(missing)} acknowledged signals lost, e.g. {list(missing)[:5]}"
    assert all("storage unavailable" in e for e in errors), errors[:3]


async def test_a_purge_while_the_database_is_away_is_refused_then_goes_through_whole(
    pg_cluster: Cluster, database: Database
) -> None:
    """Its survey cannot read: error 2 at once, nothing withdrawn; once the database is
    back, the same purge withdraws everything, read through a new reader session."""
    process = await ServerProcess(database.target).start()
    try:
        async with await process.connect() as c:
            for _ in range(3):
                await c.signal(1, "e", "view", communities=["c"])
            assert (await c.purge(2)).signals == 0  # the reader session is open
            await asyncio.to_thread(pg_cluster.stop, "fast")
            try:
                with pytest.raises(Unavailable, match="storage unavailable"):
                    await c.purge(1)
            finally:
                await asyncio.to_thread(pg_cluster.start)
            assert (await c.counts("e")).communities == {"c": {"view": Tally(3, 3.0)}}
            for _ in range(100):  # a client's retries, while the writer's backoff runs out
                try:
                    purged = await c.purge(1)
                    break
                except Unavailable:
                    await asyncio.sleep(0.05)  # a client's pace, not a synchronisation
            else:
                pytest.fail("the purge was still refused 5 s after the database came back")
            assert purged.signals == 3
            assert (await c.counts("e")).communities == {}
    finally:
        assert await process.stop() == 0


# -- a COMMIT whose answer is lost ---------------------------------------------------------

#: Holds every tidal COMMIT (a deferred trigger on meta, which each transaction writes) while
#: the test's session holds advisory lock 4242.
HOLD_COMMITS = """
CREATE FUNCTION tidal_test_hold() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_advisory_xact_lock(4242); RETURN NULL; END $$;
CREATE CONSTRAINT TRIGGER tidal_test_hold AFTER INSERT OR UPDATE ON meta
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION tidal_test_hold();
"""
COMMIT_WAITING = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 4242 AND NOT granted"
)


class Proxy:
    """A TCP relay between tidal and PostgreSQL that can stop passing PostgreSQL's answers
    (``deaf``) and cut tidal's connections: a network that loses an answer."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.deaf = False
        self.links: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._link, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _link(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.links.append(writer)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, answers: bool) -> None:
            while data := await src.read(65536):
                if not (answers and self.deaf):
                    dst.write(data)
            dst.close()

        await asyncio.gather(
            pipe(reader, up_writer, False), pipe(up_reader, writer, True), return_exceptions=True
        )

    def cut(self) -> None:
        for writer in self.links:
            writer.transport.abort()
        self.links.clear()
        self.deaf = False

    async def close(self) -> None:
        self.cut()
        if self.server is not None:
            self.server.close()


async def until(condition: Callable[[], Awaitable[bool]]) -> None:
    """Polls a condition only the database can tell (a lock waited on, a row written)."""
    for _ in range(500):
        if await condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the database never reached the state the test waits for")


async def test_a_commit_whose_answer_is_lost_is_settled_by_its_batch_id(
    pg_cluster: Cluster, database: Database
) -> None:
    """Twice: a COMMIT that held but whose answer was lost is acknowledged, once; one that
    did not hold (the database stopped under it) is refused. Meanwhile writes get error 2
    at once and health says why."""
    proxy = Proxy(pg_cluster.port)
    port = await proxy.start()
    process = await ServerProcess(
        database.target.replace(f":{pg_cluster.port}/", f":{port}/")
    ).start()
    test = await asyncpg.connect(database.target)
    try:
        async with await process.connect() as c, await process.connect() as other:
            await c.signal(1, "e", "view")
            await test.execute(HOLD_COMMITS)
            waiting = test.fetchval  # the held COMMIT shows as a lock waited on

            # 1. it held, and the answer was lost
            await test.execute("SELECT pg_advisory_lock(4242)")
            before = await test.fetchval("SELECT value FROM meta WHERE key = 'batch_id'")
            held = asyncio.create_task(c.signal(2, "e", "view"))
            await until(lambda: waiting(COMMIT_WAITING))
            proxy.deaf = True
            await test.execute("SELECT pg_advisory_unlock(4242)")  # PostgreSQL commits
            await until(
                lambda: test.fetchval("SELECT value <> $1 FROM meta WHERE key = 'batch_id'", before)
            )
            proxy.cut()  # tidal never hears that it did
            assert (await asyncio.wait_for(held, 30)).seq == 2  # acknowledged: it committed
            assert (await c.signal(3, "e", "view")).seq == 3

            # 2. it did not hold: the database stops under it
            await test.execute("SELECT pg_advisory_lock(4242)")
            lost = asyncio.create_task(c.signal(4, "e", "view"))
            await until(lambda: waiting(COMMIT_WAITING))
            await asyncio.to_thread(pg_cluster.stop, "immediate")
            try:
                with pytest.raises(Unavailable, match="outcome is known"):
                    await asyncio.wait_for(other.signal(5, "e", "view"), 5)  # at once
                health = await asyncio.wait_for(other.health(), 5)
                assert health["storage"] == "unavailable", health
                assert not lost.done()  # its fate is not known yet
            finally:
                await asyncio.to_thread(pg_cluster.start)
            with pytest.raises(Unavailable, match="nothing of this request was saved"):
                await asyncio.wait_for(lost, 30)
            assert (await c.signal(6, "e", "view")).seq == 4  # seq 4 was never given out
            assert (await c.counts("e")).ledger["view"].count == 4
        assert await process.stop() == 0
    finally:
        if not test.is_closed():
            await test.close()
        await proxy.close()
    rows = await database.rows("SELECT user_id FROM ledger ORDER BY seq")
    assert rows == [(1,), (2,), (3,), (6,)]  # each acknowledged once, the refused one absent

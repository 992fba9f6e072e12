"""What only the PostgreSQL backend has: its lock, its faults, its password.

The semantic suite runs on both backends (``both_backends``); these are the
promises of a database on a server: one tidal per database, the database
stopped (``pg_ctl -m immediate``) under load and started again, and a password
that never reaches a log.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from tidal.client import Client, Unavailable

from .conftest import Database, ServerProcess
from .postgres import PASSWORD, Cluster

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


@pytest.mark.skipif(
    not os.environ.get("TIDAL_PG_FAULTS"),
    reason="fails about 1 run in 3 (a signal unanswered for 10 s after PostgreSQL is back, and"
    " the cluster then gone): under investigation; run it with make pg-faults",
)
async def test_the_database_stopped_under_load_then_back(
    pg_cluster: Cluster, database: Database
) -> None:
    """``pg_ctl -m immediate`` while four clients write: writes get error 2 (never a wrong
    answer), health says so, tidal reconnects by itself once the database is back, and
    every acknowledged signal is there."""
    process = await ServerProcess(database.target).start()
    acked: dict[int, int] = {}  # seq -> user
    acks, refusals = Progress(), Progress()
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
                refusals.add()
                await asyncio.sleep(0.01)  # a client's pace, not a synchronisation
                continue
            acked[ack.seq] = user
            acks.add()

    clients = [await process.connect() for _ in range(4)]
    writers = [asyncio.create_task(writer(c, n)) for n, c in enumerate(clients)]
    try:
        await acks.reach(500)
        await asyncio.to_thread(pg_cluster.stop, "immediate")
        await refusals.reach(1)
        health = await clients[0].health()
        assert health["status"] == "failing" and health["storage"] == "unavailable", health
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

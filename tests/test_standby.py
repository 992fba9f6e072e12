"""A standby tidal on PostgreSQL: it waits for the database's lock, serves nothing
meanwhile, and takes over when the active one's session ends; the one it took over
from can never commit again, however it comes back.

Real processes on a real PostgreSQL: the active one is killed with SIGKILL, or
paused with SIGSTOP, for real; clients are given both addresses.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from typing import TypeVar

import pytest

from tidal.client import Client, ConnectionLost, SyncClient, Unavailable
from tidal.testing.postgres import Cluster

from .conftest import Database, ServerProcess
from .load import Progress, Writer, check_everything_acknowledged_is_there
from .relay import Relay

T = TypeVar("T")
pytestmark = [pytest.mark.parametrize("backend", ["postgresql"]), pytest.mark.timeout(180)]


async def standby_of(database: Database, *extra: str) -> ServerProcess:
    process = await ServerProcess(database.target, "--standby", *extra).start(bound=True)
    await process.logged("standby: waiting for")
    return process


async def test_a_standby_takes_over_when_the_active_tidal_is_killed(database: Database) -> None:
    active = await ServerProcess(database.target).start()
    standby = await standby_of(database)
    try:
        async with await Client.connect("127.0.0.1", standby.port, timeout=10) as c:
            health = await c.health()
            assert health["status"] == "standby", health
            assert "pid" in health["serving"], health
            with pytest.raises(Unavailable) as refused:
                await c.call("leave", 5)
            assert refused.value.message.startswith("standby: "), refused.value.message
        # the standby first in the list: the clients go to the one whose health is ok
        hosts = [("127.0.0.1", standby.port), ("127.0.0.1", active.port)]
        clients = [await Client.connect(hosts, timeout=10) for _ in range(4)]
        progress = Progress()
        writers = [Writer(c, i, progress) for i, c in enumerate(clients)]
        stop = asyncio.Event()
        tasks = [asyncio.create_task(w.run(stop)) for w in writers]
        await progress.reach(400)
        killed = time.monotonic()
        await active.kill9()
        dead = time.monotonic()  # any acknowledgement from here on is the standby's
        await standby.logged("listening on")
        took = time.monotonic() - killed
        await progress.reach(progress.count + 400)
        stop.set()
        await asyncio.gather(*tasks)
        first = min(t for w in writers for t in w.acked_at if t > dead) - killed
        retried = sum(w.refused for w in writers)
        print(
            f"kill -9 to the standby serving: {took:.2f}s; to the first acknowledged write on"
            f" it: {first:.2f}s; {retried} refusals retried by the writers"
        )
        assert first < 10, f"the first write after the kill took {first:.2f}s"
        checked = await check_everything_acknowledged_is_there(database, clients[0], writers)
        print(f"{checked} acknowledged signals and leaves checked")
        for c in clients:
            await c.close()
    finally:
        with contextlib.suppress(ProcessLookupError):
            await active.stop()
        assert await standby.stop() == 0


async def test_every_client_given_both_addresses_uses_the_one_that_serves(
    database: Database,
) -> None:
    """The blocking client and the tools (``TIDAL_HOST=h1,h2``) too; and a standby stops
    cleanly while it waits."""
    active = await ServerProcess(database.target).start()
    standby = await standby_of(database)
    both = f"127.0.0.1:{standby.port},127.0.0.1:{active.port}"
    with SyncClient(both, timeout=10) as sync:
        assert sync.leave(9).left
    env = dict(os.environ, TIDAL_HOST=both)
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "tidal.cli", "status", "9"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0 and "user 9: left" in done.stdout, done.stdout + done.stderr
    assert await standby.stop() == 0
    assert b"Traceback" not in b"".join(standby.log)
    async with await active.connect() as c:
        assert (await c.signal(1, "e", "view")).seq == 1
    assert await active.stop() == 0


async def test_a_paused_tidal_commits_nothing_once_a_standby_took_over(
    database: Database,
) -> None:
    """SIGSTOP: the kernel still answers for it, so only the database's idle timeout ends
    its session. Woken, it is sent a signal it read before the pause: refused, and it stops."""
    active = await ServerProcess(database.target, "--db-idle-timeout", "2").start()
    standby = await standby_of(database)
    async with await active.connect_with(reconnect=0) as c:
        assert (await c.signal(1, "e", "view")).seq == 1
        assert active.proc is not None
        os.kill(active.proc.pid, signal.SIGSTOP)
        paused = time.monotonic()
        late = asyncio.create_task(c.call("signal", 2, "e", "view", timeout=60))
        await standby.logged("listening on", timeout=60)
        took = time.monotonic() - paused
        print(f"SIGSTOP to the standby serving: {took:.2f}s (--db-idle-timeout 2)")
        async with await standby.connect() as s:
            assert (await s.signal(3, "e", "view")).seq == 2  # the standby serves
        os.kill(active.proc.pid, signal.SIGCONT)
        with pytest.raises((Unavailable, ConnectionLost)):
            await late
    assert await active.wait() == 3
    assert b"took the database" in b"".join(active.log) or b"another tidal" in b"".join(active.log)
    assert await database.rows("SELECT user_id FROM ledger ORDER BY seq") == [(1,), (3,)]
    assert await standby.stop() == 0


async def test_the_fence_is_checked_inside_every_transaction(database: Database) -> None:
    """Another server's commit, with this one's session and lock still alive: only the
    check in the commit's own transaction can see it. Nothing is committed; it stops."""
    active = await ServerProcess(database.target).start()
    async with await active.connect_with(reconnect=0) as c:
        assert (await c.signal(1, "e", "view")).seq == 1
        await database.rows("UPDATE meta SET value = value + 1 WHERE key = 'batch_id'")
        with pytest.raises(Unavailable) as refused:
            await c.signal(2, "e", "view")
        assert "another tidal has committed" in refused.value.message
    assert await active.wait() == 3
    assert await database.rows("SELECT user_id FROM ledger") == [(1,)]


async def test_a_cut_off_tidal_lets_a_standby_take_over_and_never_commits_again(
    database: Database, pg_cluster: Cluster
) -> None:
    """The active tidal's network to the database goes silent (no reset, no FIN): the
    database ends its session after ``--db-idle-timeout``, the standby takes over; the
    network back, the cut-off one finds it lost the lock, and stops."""
    relay = Relay(pg_cluster.port)
    await relay.start()
    url = database.target.replace(f":{relay.target}/", f":{relay.port}/")
    try:
        active = await ServerProcess(url, "--db-idle-timeout", "3").start()
        standby = await standby_of(database)
        async with await active.connect_with(reconnect=0) as c:
            assert (await c.signal(1, "e", "view")).seq == 1
            relay.go_silent()
            cut = time.monotonic()
            await standby.logged("listening on", timeout=60)
            print(f"network cut to the standby serving: {time.monotonic() - cut:.2f}s")
            with pytest.raises(Unavailable):
                await c.signal(2, "e", "view")
            relay.speak()
        assert await active.wait() == 3
        async with await standby.connect() as s:
            assert (await s.signal(3, "e", "view")).seq == 2
        assert await database.rows("SELECT user_id FROM ledger ORDER BY seq") == [(1,), (3,)]
        assert await standby.stop() == 0
    finally:
        await relay.close()

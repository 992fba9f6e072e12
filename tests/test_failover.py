"""PostgreSQL failing over under Patroni, under load, and tidal resuming on the promoted
standby without a restart, with every acknowledged signal, leave and purge there.

The cluster is real (``tidal.testing.patroni``: etcd and two PostgreSQL 15 nodes,
``synchronous_mode_strict``); tidal is given both hosts with
``target_session_attrs=read-write``. The primary's postmaster is killed with SIGKILL,
or Patroni is asked for a switchover. ``TIDAL_FAILOVER_ROUNDS=N`` (``make failover``)
runs N faults in a row instead of one.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator

import pytest

from tidal.client import Client, Unavailable
from tidal.testing.patroni import HaCluster
from tidal.testing.postgres import Missing, fetch

from .conftest import Database, ServerProcess
from .load import Progress, Writer, check_everything_acknowledged_is_there

ROUNDS = int(os.environ.get("TIDAL_FAILOVER_ROUNDS", "1"))
pytestmark = pytest.mark.timeout(240 + 60 * ROUNDS)
FAULTS = ("kill -9 of the primary's postmaster", "switchover")


@pytest.fixture(scope="module")
def ha() -> Iterator[HaCluster]:
    try:
        cluster = HaCluster()
    except Missing as exc:
        pytest.fail(str(exc))
    yield cluster
    cluster.destroy()


@pytest.mark.parametrize("fault", FAULTS)
async def test_tidal_resumes_on_the_promoted_standby_with_nothing_acknowledged_lost(
    ha: HaCluster, fault: str
) -> None:
    name = f"f{FAULTS.index(fault)}"
    await fetch(ha.url("postgres"), f"CREATE DATABASE {name}")
    database = Database("postgresql", ha.url(name))
    server = await ServerProcess(database.target).start()
    clients = [await Client.connect("127.0.0.1", server.port, timeout=120) for _ in range(4)]
    progress = Progress()
    writers = [Writer(c, i, progress) for i, c in enumerate(clients)]
    stop = asyncio.Event()
    tasks = [asyncio.create_task(w.run(stop)) for w in writers]
    try:
        for _ in range(ROUNDS):
            await progress.reach(progress.count + 300)
            leader = await asyncio.to_thread(ha.settled)
            other = next(node for node in ha.nodes if node is not leader)
            began = time.monotonic()
            if fault == FAULTS[0]:
                ha.kill_postmaster(leader)
            else:
                await asyncio.to_thread(ha.switchover, leader, other)
            await asyncio.to_thread(ha.wait, lambda o=other: ha.leader() is o, "promotion")
            promoted = time.monotonic()
            await progress.reach(progress.count + 300)
            first = min(t for w in writers for t in w.acked_at if t > promoted)
            print(
                f"{fault}: {other.name} promoted after {promoted - began:.2f}s; the first write"
                f" acknowledged on it after {first - began:.2f}s (strict synchronous mode waits"
                " for the old primary to rejoin as its standby)"
            )
        stop.set()
        await asyncio.gather(*tasks)
        assert server.proc is not None and server.proc.returncode is None, "tidal restarted"
        checked = await check_everything_acknowledged_is_there(database, clients[0], writers)
        refused = sum(w.refused for w in writers)
        print(f"{checked} acknowledgements checked; {refused} refusals retried by the writers")
    finally:
        stop.set()
        for c in clients:
            await c.close()
        code = await server.stop()
    assert code == 0, b"".join(server.log).decode()[-3000:]
    assert b"reconnected to" in b"".join(server.log)


async def test_a_commit_whose_wait_for_the_standby_is_cancelled_is_never_acknowledged(
    ha: HaCluster,
) -> None:
    """Someone cancels tidal's COMMIT while it waits for the synchronous standby (here the
    primary's WAL sender is stopped, so it waits): PostgreSQL returns it as committed, with
    a WARNING, on the primary alone. tidal answers error 2, outcome unknown, and latches."""
    await fetch(ha.url("postgres"), "CREATE DATABASE cancelled")
    database = Database("postgresql", ha.url("cancelled"))
    server = await ServerProcess(database.target).start()
    leader = await asyncio.to_thread(ha.settled)
    primary = ha.leader_url("cancelled")
    async with await Client.connect("127.0.0.1", server.port, timeout=60) as c:
        assert (await c.signal(1, "e", "view")).seq == 1
        [(sender,)] = await fetch(primary, "SELECT pid FROM pg_stat_replication")
        os.kill(sender, signal.SIGSTOP)
        try:
            late = asyncio.create_task(c.signal(2, "e", "view"))
            waiting = "SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
            for _ in range(600):
                if found := await fetch(primary, waiting):
                    break
                await asyncio.sleep(0.05)  # the database's state, polled
            else:
                raise AssertionError("tidal's COMMIT never waited for the standby")
            await fetch(primary, "SELECT pg_cancel_backend($1)", found[0][0])
            with pytest.raises(Unavailable) as refused:
                await late
        finally:
            os.kill(sender, signal.SIGCONT)
        assert "may not survive a failover" in refused.value.message, refused.value.message
        assert "unknown" in refused.value.message
        health = await c.health()
        assert health["status"] == "failing" and health["storage"] == "failed", health
    assert await server.stop() == 1  # the last checkpoint cannot commit, and it says so
    # on the primary's disk, as PostgreSQL said, though never acknowledged
    assert (2,) in await fetch(primary, "SELECT user_id FROM ledger")
    assert leader is ha.leader()

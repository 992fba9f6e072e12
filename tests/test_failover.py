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

from tidal.client import Client
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
    except BaseException:
        print(b"".join(server.log).decode()[-6000:], ha.logs(), sep="\n")  # what went wrong
        raise
    finally:
        stop.set()
        for c in clients:
            await c.close()
        code = await server.stop()
    assert code == 0, b"".join(server.log).decode()[-3000:]
    assert b"reconnected to" in b"".join(server.log)


async def test_a_commit_whose_wait_for_the_standby_is_cancelled_waits_for_the_standby(
    ha: HaCluster,
) -> None:
    """Someone cancels tidal's COMMIT while it waits for the synchronous standby (here the
    primary's WAL sender is stopped, so it waits): PostgreSQL returns it as committed, with
    a WARNING, on the primary alone. tidal does not acknowledge it until a later synchronous
    commit has returned, so the standby has it; then it does, once."""
    await fetch(ha.url("postgres"), "CREATE DATABASE cancelled")
    database = Database("postgresql", ha.url("cancelled"))
    server = await ServerProcess(database.target).start()
    leader = await asyncio.to_thread(ha.settled)
    standby = next(node for node in ha.nodes if node is not leader)
    primary = ha.leader_url("cancelled")
    waiting = "SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep'"

    async def commit_waiting_for_the_standby(but_not: int | None = None) -> int:
        for _ in range(600):
            pids = [int(pid) for (pid,) in await fetch(primary, waiting) if pid != but_not]
            if pids:
                return pids[0]
            await asyncio.sleep(0.05)  # the database's state, polled
        raise AssertionError("no COMMIT of tidal's waited for the standby")

    async with await Client.connect("127.0.0.1", server.port, timeout=60) as c:
        assert (await c.signal(1, "e", "view")).seq == 1
        [(sender,)] = await fetch(primary, "SELECT pid FROM pg_stat_replication")
        os.kill(sender, signal.SIGSTOP)
        try:
            late = asyncio.create_task(c.signal(2, "e", "view"))
            cancelled = await commit_waiting_for_the_standby()
            await fetch(primary, "SELECT pg_cancel_backend($1)", cancelled)
            # PostgreSQL says committed; tidal waits in a later synchronous commit instead
            await commit_waiting_for_the_standby(but_not=cancelled)
            assert not late.done(), "acknowledged before the standby had it"
            assert (2,) in await fetch(primary, "SELECT user_id FROM ledger")  # on one disk
        finally:
            os.kill(sender, signal.SIGCONT)
        assert (await late).seq == 2
        assert (await c.health())["status"] == "ok"
    replica = primary.replace(f":{leader.port}/", f":{standby.port}/")
    assert await fetch(replica, "SELECT user_id FROM ledger ORDER BY seq") == [(1,), (2,)]
    assert await server.stop() == 0
    log = b"".join(server.log)
    assert b"canceling wait for synchronous replication" in log and b"the COMMIT held" in log

"""Cluster mode for the long run: the commit log is pruned below each node's checkpoint of
its board, and a node boots from the newest checkpoint, replaying only the log past it
(issue 40's item 8). Real nodes in this process on a real PostgreSQL; the checkpoint
interval is made small (``cluster.upkeep.CHECKPOINT_RECORDS``) so that a test's history spans
many of them."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

import msgpack
import pytest

from tidal.client import Client, ClusterClient
from tidal.server.app import Server
from tidal.server.cluster import upkeep
from tidal.server.config import Config
from tidal.testing.postgres import free_port

from .conftest import Database

pytestmark = [pytest.mark.parametrize("backend", ["postgresql"]), pytest.mark.timeout(180)]
EVERY = 40  # log records between checkpoints, here


def node(database: Database, port: int) -> Server:
    config = Config(
        host="127.0.0.1", port=port, db=database.target, cluster="log",
        advertise=f"127.0.0.1:{port}", checkpoint_seconds=0.05,
    )  # fmt: skip
    return Server(config)


async def settled(servers: list[Server]) -> None:
    """Returns once every node serves a share of the partitions (polled: their ticks)."""
    wanted = {f"127.0.0.1:{srv.address[1]}" for srv in servers}
    async with await Client.connect(*servers[0].address, timeout=10) as c:
        for _ in range(1000):
            if {o for o, _ in (await c.call("partition_map"))["owners"]} == wanted:
                return
            await asyncio.sleep(0.02)  # other nodes' ticks: a pace
    raise AssertionError("the nodes did not share the partitions in 20 s")


async def write(servers: list[Server], signals: int) -> None:
    """``signals`` single signals from eight routing clients, one commit each or a few."""
    seeds = ",".join(f"127.0.0.1:{srv.address[1]}" for srv in servers)
    clients = [await ClusterClient.connect(seeds, timeout=10) for _ in range(8)]

    async def one(i: int, c: ClusterClient) -> None:
        for n in range(i, signals, len(clients)):
            await c.signal(n % 300, f"e{n % 11}", "view", communities=["c"])

    await asyncio.gather(*(one(i, c) for i, c in enumerate(clients)))
    for c in clients:
        await c.close()


async def log_rows(database: Database) -> tuple[int, int, int]:
    ((rows, first, last),) = await database.rows(
        "SELECT count(*), COALESCE(MIN(id), 0), COALESCE(MAX(id), 0) FROM tidal_log"
    )
    return rows, first, last


async def exact(database: Database, server: Server) -> None:
    """``server`` counts every entity as a recompute from the ledger does."""
    ledger = await database.rows("SELECT entity, forwarded, context FROM ledger")
    views = Counter(entity for entity, _, _ in ledger)
    community = Counter(
        entity
        for entity, fwd, context in ledger
        if fwd and "c" in msgpack.unpackb(context, raw=False)[0]
    )
    async with await Client.connect(*server.address, timeout=10) as c:
        for entity in views:
            counts = await c.counts(entity)
            assert counts.ledger["view"].count == views[entity], entity
            assert counts.communities["c"]["view"].count == community[entity], entity


async def test_the_log_is_pruned_below_checkpoints_and_a_node_boots_from_one(
    database: Database, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(upkeep, "CHECKPOINT_RECORDS", EVERY)
    caplog.set_level(logging.INFO, logger="tidal.cluster")
    ports = [free_port(), free_port()]
    servers = [node(database, port) for port in ports]
    try:
        for srv in servers:
            await srv.start()
        await settled(servers)
        held: list[tuple[int, int, int]] = []
        for _ in range(3):
            await write(servers, 3_000)
            held.append(await log_rows(database))
        print(f"tidal_log (rows, first id, last id) after each 3,000 signals: {held}")
        rows, first, last = held[-1]
        assert last > 6 * EVERY, f"too few commits to say anything: {held}"
        assert first > 1, f"the log was never pruned: {held}"
        # what is kept: what the newest checkpoint does not cover, and what a node has not
        # applied and published yet (a tick), and a checkpoint's worth of records at most
        assert rows <= 4 * EVERY, f"the log holds {rows} rows: {held}"
        assert rows <= held[0][0] + 2 * EVERY, f"the log grows with the history: {held}"
        checkpoints = await database.rows("SELECT node, log_id FROM tidal_checkpoints")
        assert max(log_id for _, log_id in checkpoints) >= first - 1  # nothing it needs went
        for srv in servers:
            await exact(database, srv)
        # a node restarted with its address boots from the newest checkpoint
        await servers[1].shutdown()
        caplog.clear()
        servers[1] = node(database, ports[1])
        await servers[1].start()
        await settled(servers)
        replayed = [r.getMessage() for r in caplog.records if "replayed" in r.getMessage()]
        assert replayed, "the booting node said nothing of what it replayed"
        count = int(replayed[0].split()[1])
        assert count <= 4 * EVERY, f"the boot replayed {count} records: {replayed[0]}"
        await write(servers, 1_000)
        for srv in servers:
            await exact(database, srv)
    finally:
        for srv in servers:
            await srv.shutdown()


async def test_blocks_of_ledger_users_are_merged_and_purges_and_erasures_stay_exact(
    database: Database,
) -> None:
    """Each commit writes its own block of ``ledger_users``; the node serving partition 0
    merges runs of them into blocks of up to 4,096 rows, under the log head's lock, while
    both nodes write, purge and erase. Where the blocks were merged, a purge and an erase
    still find every row of their user (issue 40: a block per commit, for ever, and every
    survey read them all)."""
    servers = [node(database, free_port()) for _ in range(2)]
    try:
        for srv in servers:
            await srv.start()
        await settled(servers)
        await write(servers, 6_000)  # 300 users, ~20 rows each, in some hundreds of commits
        ((commits,),) = await database.rows("SELECT log_id FROM tidal_cluster")
        for _ in range(500):  # merged on the ticks of the node serving partition 0
            ((blocks,),) = await database.rows("SELECT count(*) FROM ledger_users")
            if blocks * 10 <= commits:
                break
            await asyncio.sleep(0.02)  # other tasks' ticks: a pace
        assert blocks * 10 <= commits, f"{blocks} blocks left of {commits} commits' runs"
        listed = await database.rows("SELECT first_seq, users FROM ledger_users")
        entries = sum(len(users) // 8 for _, users in listed)
        ((rows,),) = await database.rows("SELECT count(*) FROM ledger")
        assert entries == rows, "a merge lost or repeated entries"
        seeds = ",".join(f"127.0.0.1:{srv.address[1]}" for srv in servers)
        async with await ClusterClient.connect(seeds, timeout=10) as c:
            for user in range(0, 300, 7):  # half purged, half erased: each finds every row
                if user % 2:
                    ((had,),) = await database.rows(
                        "SELECT count(*) FROM ledger WHERE user_id = ?", user
                    )
                    assert (await c.erase(user)).signals == had, user
                else:
                    ((had,),) = await database.rows(
                        "SELECT count(*) FROM ledger WHERE user_id = ? AND forwarded = 1", user
                    )
                    assert (await c.purge(user)).signals == had, user
            await write(servers, 600)  # the rewrites go on with later commits
        for srv in servers:
            await exact(database, srv)
    finally:
        for srv in servers:
            await srv.shutdown()


async def test_ledger_retention_in_cluster_mode_retires_every_node_s_old_rows(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--ledger-retention`` on a cluster: the node serving partition 0 deletes the rows
    past the retention in every node's range of seqs, and the blocks of ``ledger_users``
    left empty; the board keeps counting them, as one tidal's does, and a purge reaches
    only what is kept (issue 40: refused at start in cluster mode). Blocks stay one per
    commit here (none merged), so that the old rows' blocks hold no young row."""
    monkeypatch.setattr(upkeep, "MERGE_HEADS", 0)
    now = [1_700_000_000 * 10**9]
    day = 86_400 * 10**9
    ports = [free_port(), free_port()]

    def retaining(port: int) -> Server:
        config = Config(
            host="127.0.0.1", port=port, db=database.target, cluster="log",
            advertise=f"127.0.0.1:{port}", ledger_retention=86_400,
        )  # fmt: skip
        return Server(config, clock=lambda: now[0])

    servers = [retaining(port) for port in ports]
    try:
        for srv in servers:
            await srv.start()
        await settled(servers)
        await write(servers, 1_200)  # 300 users over both nodes: both ranges of seqs
        ((old,),) = await database.rows("SELECT count(*) FROM ledger")
        now[0] += 2 * day
        await write(servers, 300)  # young rows, after the old ones in each range
        async with await Client.connect(*servers[0].address, timeout=10) as c:
            before = {e: await c.counts(e) for e in (f"e{n}" for n in range(11))}
            leader = (await c.call("partition_map"))["owners"][0][0]
        # the leader's passes come every tenth of the retention: one starts as it boots
        i = [f"127.0.0.1:{port}" for port in ports].index(leader)
        await servers[i].shutdown()
        servers[i] = retaining(ports[i])
        await servers[i].start()
        await settled(servers)
        retention = servers[i].engine.retention
        await asyncio.wait_for(retention.caught_up.wait(), 30)
        ((kept,),) = await database.rows("SELECT count(*) FROM ledger")
        assert (kept, retention.retired) == (300, old), (kept, old, retention.retired)
        listed = await database.rows("SELECT first_seq, users FROM ledger_users")
        assert sum(len(users) // 8 for _, users in listed) == kept, "old blocks were kept"
        seeds = ",".join(f"127.0.0.1:{srv.address[1]}" for srv in servers)
        async with await ClusterClient.connect(seeds, timeout=10) as routed:
            for e, counts in before.items():
                assert await routed.counts(e) == counts, e  # the board keeps counting them
            ((young,),) = await database.rows(
                "SELECT count(*) FROM ledger WHERE user_id = 1 AND forwarded = 1"
            )
            assert (await routed.purge(1)).signals == young  # only what is kept
    finally:
        for srv in servers:
            await srv.shutdown()

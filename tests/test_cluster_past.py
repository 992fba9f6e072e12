"""Cluster mode: purge and erase, on the node that serves the user, withdrawn from every
node's counts exactly; their rows found though an earlier owner wrote some, and rewritten
to the end though the node that took the withdrawal is killed. Real node processes on a
real PostgreSQL, as in ``test_cluster``."""

from __future__ import annotations

import asyncio
import time
from array import array
from collections.abc import Iterable
from typing import Any

import pytest

from tidal.client import Client, ClusterClient, FeedEvent, Signal
from tidal.protocol.partitions import partition

from .conftest import Database, ServerProcess
from .test_cluster import PARTITIONS, TAKEOVER, Nodes, nodes, owner, recompute

__all__ = ["nodes"]  # the fixture, used by name

pytestmark = [pytest.mark.parametrize("backend", ["postgresql"]), pytest.mark.timeout(180)]


def seeds(serving: list[ServerProcess]) -> str:
    return ",".join(Nodes.address(n) for n in serving)


async def rewritten(database: Database, within: float = 60.0) -> float:
    """Returns once every withdrawn row is rewritten (no rule is left); how long it took."""
    began = time.monotonic()
    while await database.rows("SELECT 1 FROM rewrites"):
        if time.monotonic() - began > within:
            left = await database.rows("SELECT user_id, purge_before, erase_before FROM rewrites")
            raise AssertionError(f"rows still to rewrite after {within}s: rules {left}")
        await asyncio.sleep(0.05)  # polling another process's progress: a pace
    return time.monotonic() - began


async def counted_everywhere(
    database: Database, readers: Iterable[Client], entities: Iterable[str]
) -> None:
    """Each reader (a node each) counts every entity as a recompute from the ledger does."""
    recount = await recompute(database)
    for reader in readers:
        for entity in entities:
            counts = await reader.counts(entity)
            got = {("ledger", kind): t.count for kind, t in counts.ledger.items()}
            for name, kinds in counts.communities.items():
                got.update({(f"community:{name}", k): t.count for k, t in kinds.items()})
            for name, kinds in counts.cohorts.items():
                got.update({(f"cohort:{name}", k): t.count for k, t in kinds.items()})
            wanted = {(layer, kind): n for (e, layer, kind), n in recount.items() if e == entity}
            assert {k: n for k, n in got.items() if n} == wanted, entity


async def blocks_list_every_row(database: Database, erased: Iterable[int]) -> None:
    """``ledger_users`` lists each ledger row's user under its seq (each commit's rows in a
    block of their own), and nothing of an erased user's."""
    listed: dict[int, int] = {}
    for first, users in await database.rows("SELECT first_seq, users FROM ledger_users"):
        block = array("q")
        block.frombytes(users)
        listed.update((first + i, user) for i, user in enumerate(block))
    rows = await database.rows("SELECT seq, user_id FROM ledger")
    assert rows and all(listed.get(seq) == user for seq, user in rows)
    assert not set(erased) & set(listed.values()), "an erased user is left in ledger_users"


async def replayed(serving: list[ServerProcess], count: int) -> list[list[FeedEvent]]:
    """The change feed from 0 on each node: its first ``count`` events."""
    out = []
    for node in serving:
        async with await node.connect() as stock:
            events: list[FeedEvent] = []
            async with stock.subscribe(from_id=0) as feed:
                async for event in feed:
                    events.append(event)
                    if len(events) == count:
                        break
            out.append(events)
    return out


def attrs(user: int) -> dict[str, Any]:
    return {"plan": "pro" if user % 2 else "free"}


async def test_purge_and_erase_on_the_user_s_node_withdraw_exactly_from_every_node(
    nodes: Nodes, database: Database
) -> None:
    serving = await nodes.serving(2, "--rewrite-chunk", "8")
    users = range(60)
    first_seqs: dict[int, int] = {}
    async with await ClusterClient.connect(seeds(serving), timeout=10) as c:
        assert await c.define_cohort("pro", {"plan": "pro"})
        for r in range(3):
            for u in users:
                ack = await c.signal(
                    u, f"e{u % 4}", "view", communities=["c"], attrs=attrs(u), key=f"k{r}-{u}"
                )
                first_seqs.setdefault(u, ack.seq)
        # a third node takes its share: the rows of its users so far were written by the
        # nodes that served them before, its own from now on
        serving.append(await nodes.start())
        await nodes.settled(serving)
        cluster_map = await nodes.map(serving[0])
        joined = {u for u in users if owner(cluster_map, u) == nodes.address(serving[2])}
        assert joined, "the third node serves none of the users"
        for u in users:
            await c.signal(u, f"e{u % 4}", "view", communities=["c"], attrs=attrs(u), key=f"k3-{u}")
        purged = [u for u in users if u % 3 == 0]
        erased = [u for u in users if u % 3 == 1]
        leaving = [u for u in users if u % 3 == 2 and u % 4 == 2]
        withdrawn, left = await asyncio.gather(
            asyncio.gather(*(c.purge(u) for u in purged), *(c.erase(u) for u in erased)),
            asyncio.gather(*(c.leave(u, purge=True) for u in leaving)),
        )
        assert [w.signals for w in withdrawn] == [4] * len(withdrawn)
        assert [m.purged for m in left] == [4] * len(leaving)
        assert (await c.purge(purged[0])).signals == 0, "nothing is withdrawn twice"
        # an erased user stays Left, and a key of theirs from before is forgotten
        u = erased[0]
        assert (await c.status(u)).left
        again = await c.signal(u, "e0", "view", key=f"k0-{u}")
        assert not again.forwarded and again.seq != first_seqs[u]
        assert [(e.event, e.signals) for e in await c.history(purged[1])] == [("purge", 4)]
        assert [(e.event, e.signals) for e in await c.history(leaving[0])] == [
            ("leave", None),
            ("purge", 4),
        ]
    took = await rewritten(database)
    print(f"every withdrawn row rewritten {took:.2f}s after the last withdrawal's ack")
    ledger = await database.rows("SELECT user_id, forwarded FROM ledger")
    assert all(not fwd for user, fwd in ledger if user in purged or user in leaving)
    assert sorted(user for user, _ in ledger if user in erased) == [erased[0]]  # its new row
    await blocks_list_every_row(database, erased[1:])
    readers = [await n.connect() for n in serving]
    try:
        await counted_everywhere(database, readers, [f"e{i}" for i in range(4)])
    finally:
        for reader in readers:
            await reader.close()
    # the feed: every node pushes the same events, with the counts the owners found
    feeds = await replayed(serving, 1 + len(withdrawn) + 2 * len(left))
    assert all(events == feeds[0] for events in feeds)
    by_user = {e.user_id: e for e in feeds[0][1:]}  # each user's last event
    assert all(by_user[u].event == "purge" and by_user[u].purged == 4 for u in purged)
    assert all(by_user[u].event == "erase" and by_user[u].erased == 4 for u in erased)
    # a leave with purge: a leave event, then a purge event of its own
    assert all(by_user[u].event == "purge" and by_user[u].purged == 4 for u in leaving)
    assert sorted(e.user_id or 0 for e in feeds[0] if e.event == "leave") == leaving
    # a node booted now replays the commit log, withdrawals with the rest: the same counts
    late = await nodes.start()
    async with await late.connect() as reader:
        await counted_everywhere(database, [reader], [f"e{i}" for i in range(4)])


async def test_a_purge_s_rows_are_rewritten_by_the_next_owner_when_its_node_is_killed(
    nodes: Nodes, database: Database
) -> None:
    serving = await nodes.serving(3, "--rewrite-chunk", "1")
    cluster_map = await nodes.map(serving[0])
    victim = serving[2]
    user = next(u for u in range(1000) if owner(cluster_map, u) == nodes.address(victim))
    rows = 400
    async with await ClusterClient.connect(seeds(serving), timeout=10) as c:
        assert await c.define_cohort("pro", {"plan": "pro"})
        for start in range(0, rows, 100):
            await c.signal_batch(
                Signal(user, f"e{i % 3}", "view", communities=["c"], attrs={"plan": "pro"})
                for i in range(start, start + 100)
            )
        assert (await c.purge(user)).signals == rows
        await victim.kill9()  # a row a commit: hundreds still to rewrite
        left = await database.rows(
            "SELECT COUNT(*) FROM ledger WHERE user_id = ? AND forwarded = 1", user
        )
        assert left[0][0] > 0, "every row was rewritten before the kill: nothing is tested"
        killed = time.monotonic()
        await nodes.settled(serving[:2])
        served = time.monotonic() - killed
        took = await rewritten(database)
        history = await c.history(user)
        assert [(e.event, e.signals) for e in history] == [("purge", rows)]
        assert (await c.purge(user)).signals == 0
    print(
        f"kill -9 with {left[0][0]} of {rows} rows to rewrite: the partition served again in"
        f" {served:.2f}s, the rest rewritten by its next owner {took:.2f}s after that"
    )
    assert served < TAKEOVER
    assert partition(user, PARTITIONS) in {
        p for p, (o, _) in enumerate((await nodes.map(serving[0]))["owners"]) if o
    }
    ledger = await database.rows("SELECT forwarded FROM ledger WHERE user_id = ?", user)
    assert len(ledger) == rows and not any(fwd for (fwd,) in ledger)
    readers = [await n.connect() for n in serving[:2]]
    try:
        await counted_everywhere(database, readers, ["e0", "e1", "e2"])
    finally:
        for reader in readers:
            await reader.close()

"""Cluster mode under concurrent clients: cohort changes, purges and the change feed
issued through several nodes at once (issue 40's items 2-7). Three real nodes in this
process, on a real PostgreSQL; stock clients talk to one node each, as a client in
another language would, and routing clients send each user's writes to their node."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import msgpack
import pytest

from tidal.client import Client, ClusterClient, Unavailable
from tidal.protocol.partitions import partition
from tidal.server.app import Server

from .conftest import Database, three_nodes
from .rawrpc import RawPeer
from .test_postgres import Progress

pytestmark = [pytest.mark.parametrize("backend", ["postgresql"]), pytest.mark.timeout(180)]


async def stocks(servers: list[Server]) -> list[Client]:
    return [await Client.connect(*srv.address, timeout=10) for srv in servers]


def seeds(servers: list[Server]) -> str:
    return ",".join(f"127.0.0.1:{srv.address[1]}" for srv in servers)


async def test_a_cohort_change_on_one_node_is_seen_by_the_next_change_on_another(
    database: Database,
) -> None:
    async with three_nodes(database) as servers:
        a, b, c = await stocks(servers)
        for i in range(10):
            # defined on one node, then dropped on another: dropped everywhere
            assert await a.define_cohort(f"x{i}", {"k": i}) is True
            assert await b.drop_cohort(f"x{i}") is True, f"x{i}: B did not see A's define"
            # dropped on one node, then defined again on another: defined everywhere
            assert await a.define_cohort(f"y{i}", {"k": i}) is True
            assert await b.drop_cohort(f"y{i}") is True
            assert await c.define_cohort(f"y{i}", {"k": i}) is True
            for node in (a, b, c):
                listed = await node.cohorts()
                assert f"x{i}" not in listed, f"x{i} still listed after its drop"
                assert listed.get(f"y{i}") == {"k": i}, f"y{i}'s second define was lost"
        # dropping what no node has defined answers false, on any node
        assert await c.drop_cohort("never") is False
        rows = await database.rows("SELECT name FROM cohorts ORDER BY name")
        assert rows == [(f"y{i}",) for i in range(10)]
        for node in (a, b, c):
            await node.close()


async def test_cohorts_defined_on_two_nodes_at_once_each_get_an_id_of_their_own(
    database: Database,
) -> None:
    async with three_nodes(database) as servers:
        a, b, c = await stocks(servers)

        async def define(server: Server, first: int) -> list[Any]:
            """A stock client's answers: a refusal is an answer, not retried."""
            peer = await RawPeer.open(server.address)
            answers: list[Any] = []
            for i in range(first, first + 40):
                reply = await peer.call("define_cohort", f"d{i}", {"k": i}, msgid=i)
                answers.append(reply[3] if reply[2] is None else reply[2])
            peer.close()
            return answers

        both = await asyncio.gather(define(servers[0], 0), define(servers[1], 40))
        answers = [*itertools.chain(*both)]
        refused = [answer for answer in answers if answer is not True]
        assert not refused, f"{len(refused)} of 80 defines refused: {refused[:3]}"
        rows = await database.rows("SELECT id, name FROM cohorts")
        assert len(rows) == 80 and len({cid for cid, _ in rows}) == 80
        for node in (a, b, c):
            listed = await node.cohorts()
            assert listed == {f"d{i}": {"k": i} for i in range(80)}
            await node.close()


async def owners(servers: list[Server]) -> dict[int, int]:
    """Users 0..999 -> the index of the server that owns them."""
    async with await Client.connect(*servers[0].address, timeout=10) as c:
        cluster_map = await c.call("partition_map")
    where = {f"127.0.0.1:{srv.address[1]}": i for i, srv in enumerate(servers)}
    return {
        user: where[cluster_map["owners"][partition(user, cluster_map["partitions"])][0]]
        for user in range(1000)
    }


async def test_a_signal_after_a_cohort_change_on_another_node_is_accepted_and_counted(
    database: Database,
) -> None:
    """The node whose batch was matched against cohorts another node changed meanwhile
    matches it again and commits it: a stock client never sees ``retry:``."""
    async with three_nodes(database) as servers:
        stock = await stocks(servers)
        raw = [await RawPeer.open(srv.address) for srv in servers]
        owner = await owners(servers)
        for i in range(50):
            user = next(u for u in range(1000) if owner[u] == (i + 1) % 3)
            assert await stock[i % 3].define_cohort(f"z{i}", {"k": i})
            signal = [user, f"e{i}", "view", 1.0, {"attrs": {"k": i}}]
            reply = await raw[owner[user]].call("signal", *signal, msgid=i)
            assert reply[2] is None, f"round {i}: {reply[2]}"
            for node in stock:  # defined before the signal was sent: counted in it
                counts = await node.counts(f"e{i}")
                assert counts.cohorts[f"z{i}"]["view"].count == 1, (i, counts)
        for node in stock:
            await node.close()
        for peer in raw:
            peer.close()


async def test_writers_under_cohort_churn_are_never_told_to_retry(database: Database) -> None:
    """Six stock writers, two on each node, each for users that node owns, while cohorts
    are defined and dropped through every node: each signal is acknowledged on its first
    try, and each cohort counts exactly the rows that say they matched it (their
    context), on every node."""
    async with three_nodes(database) as servers:
        stock = await stocks(servers)
        owner = await owners(servers)
        refusals: list[Any] = []
        acked = Progress()
        done = asyncio.Event()

        async def write(index: int) -> None:
            node = index % 3
            users = [u for u in range(1000) if owner[u] == node]
            peer = await RawPeer.open(servers[node].address)
            try:
                for n in itertools.count():
                    if done.is_set():
                        return
                    user = users[(index * 7 + n) % len(users)]
                    signal = [user, f"e{n % 5}", "view", 1.0, {"attrs": {"k": n % 8}}]
                    reply = await peer.call("signal", *signal, msgid=n)
                    if reply[2] is None:
                        acked.add()
                    else:
                        refusals.append(reply[2])
            finally:
                peer.close()

        tasks = [asyncio.create_task(write(i)) for i in range(6)]
        try:
            for round_ in range(12):  # a change every 150 acknowledged signals
                await acked.reach(acked.count + 150)
                node, name = stock[round_ % 3], f"k{round_ % 2}"  # each dropped is defined
                if round_ % 3 == 2:
                    assert await node.drop_cohort(name)
                else:
                    assert await node.define_cohort(name, {"k": round_ % 8})
        finally:
            done.set()
            await asyncio.gather(*tasks)
        assert not refusals, f"{len(refusals)} refused, first: {refusals[0]}"
        rows = await database.rows("SELECT entity, context FROM ledger WHERE forwarded = 1")
        ids = dict(await database.rows("SELECT id, name FROM cohorts"))
        expected: dict[tuple[str, str], int] = {}
        for entity, context in rows:
            for cid in msgpack.unpackb(context, raw=False)[2]:
                if cid in ids:
                    expected[(entity, ids[cid])] = expected.get((entity, ids[cid]), 0) + 1
        for node in stock:
            for e in range(5):
                counts = await node.counts(f"e{e}")
                got = {name: by_kind["view"].count for name, by_kind in counts.cohorts.items()}
                want = {name: n for (entity, name), n in expected.items() if entity == f"e{e}"}
                assert got == want, (f"e{e}", got, want)
            await node.close()


async def test_purges_on_two_nodes_while_both_write_take_their_locks_in_one_order(
    database: Database,
) -> None:
    async with three_nodes(database) as servers:
        clients = [await ClusterClient.connect(seeds(servers), timeout=10) for _ in range(4)]
        errors: list[str] = []
        done = asyncio.Event()

        async def write(index: int, c: ClusterClient) -> None:
            for n in itertools.count():
                if done.is_set():
                    return
                user = index * 1_000 + n % 200
                try:
                    await c.signal(user, "e", "view", communities=["c"])
                    if n % 7 == 0:
                        await (c.erase if n % 14 == 0 else c.purge)(user)
                except Unavailable as exc:
                    errors.append(str(exc))

        tasks = [asyncio.create_task(write(i, c)) for i, c in enumerate(clients)]
        try:
            async with await Client.connect(*servers[0].address, timeout=10) as probe:
                for _ in range(40):
                    health = await probe.health()
                    assert health["status"] != "failing", health
                    if errors:
                        break
                    await asyncio.sleep(0.1)  # six seconds of writes, purges and erasures
        finally:
            done.set()
            await asyncio.gather(*tasks)
        assert not errors, f"{len(errors)} refused, first: {errors[0]}"
        for c in clients:
            await c.close()


async def test_a_feed_read_on_one_node_resumes_on_another(database: Database) -> None:
    async with three_nodes(database) as servers:
        a, b = servers[0], servers[1]
        async with await ClusterClient.connect(seeds(servers), timeout=10) as writer:
            for i in range(20):
                first = await RawPeer.open(a.address)
                reply = await first.call("subscribe", {})
                assert reply[2] is None, reply
                await writer.leave(10_000 + i)
                event = await first.receive()
                while event[1] != "event":
                    event = await first.receive()
                read = msgpack_id(event)
                first.close()
                second = await RawPeer.open(b.address)
                reply = await second.call("subscribe", {"from": read})
                assert reply[2] is None, f"round {i}: resuming on B from {read}: {reply[2]}"
                second.close()


def msgpack_id(notification: list[Any]) -> int:
    event: dict[str, Any] = notification[2][0]
    return int(event["id"])


async def test_replaying_feeds_never_repeat_or_skip_an_event_while_writes_go_on(
    database: Database,
) -> None:
    async with (
        three_nodes(database) as servers,
        await ClusterClient.connect(seeds(servers), timeout=10) as c,
    ):
        for user in range(200):
            await c.leave(user)
        done = asyncio.Event()

        async def churn() -> None:
            for user in itertools.count(1_000):
                if done.is_set():
                    return
                await c.leave(user)

        async def replay(server: Server, start: int, through: int) -> list[int]:
            """The ids a subscriber from ``start`` is sent, as they come on the wire."""
            peer = await RawPeer.open(server.address)
            try:
                reply = await peer.call("subscribe", {"from": start})
                assert reply[2] is None, reply
                ids: list[int] = []
                while not ids or ids[-1] < through:
                    message = await peer.receive()
                    if message[1] == "event":
                        ids += [event["id"] for event in message[2]]
                return ids
            finally:
                peer.close()

        writing = asyncio.create_task(churn())
        try:
            for round_ in range(5):
                start, through = round_ * 40, 200 + 100 * (round_ + 1)
                got = await asyncio.wait_for(
                    asyncio.gather(*(replay(servers[i % 3], start, through) for i in range(6))),
                    60,
                )
                for ids in got:
                    wrong = [(x, y) for x, y in itertools.pairwise(ids) if y != x + 1]
                    assert ids[0] == start + 1 and not wrong, f"from {start}: {wrong[:5]}"
        finally:
            done.set()
            await writing

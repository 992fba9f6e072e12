"""Consumer groups in cluster mode, on three real nodes and a real PostgreSQL: partition 0's
node serves every group, from the events of every node's commits in log order; the
others answer ``moved`` naming it, which the cluster client follows. Killed (kill -9) or
stopped, its groups are served by the node that takes partition 0, as committed: what
was acknowledged is never sent again, what was not is, and each user's events still
come in order."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from tidal.client import (
    Client,
    ClusterClient,
    ConnectionLost,
    Moved,
    SyncClusterClient,
    TidalError,
)
from tidal.client.consumer import Consumer
from tidal.protocol.partitions import GROUPS

from .conftest import Database, ServerProcess
from .group_peer import GroupPeer
from .test_cluster import Nodes
from .test_groups_durable import tidal, watching

pytestmark = pytest.mark.parametrize("backend", ["postgresql"])


@pytest.fixture
async def cluster(database: Database) -> AsyncIterator[Nodes]:
    nodes = Nodes(database)
    yield nodes
    await nodes.stop()


@dataclass
class Taker:
    """One consumer: what it received (id, user, deliveries, when) and when each ack was
    answered."""

    consumer: Consumer
    got: list[tuple[int, int | None, int, float]] = field(default_factory=list)
    acked: dict[int, float] = field(default_factory=dict)

    async def run(self) -> None:
        async for d in self.consumer:
            self.got.append((d.id, d.user_id, d.deliveries, time.monotonic()))
            with contextlib.suppress(ConnectionLost, TidalError):  # sent again: acked then
                await d.ack()
                self.acked[d.id] = time.monotonic()


async def lead(nodes: Nodes, serving: list[ServerProcess]) -> ServerProcess:
    """The node that serves partition 0, and with it the groups."""
    owner = (await nodes.map(serving[0]))["owners"][GROUPS][0]
    return next(n for n in serving if nodes.address(n) == owner)


async def until(check: object, what: str, within: float = 30.0) -> None:
    began = time.monotonic()
    while not await check():  # type: ignore[operator]
        if time.monotonic() - began > within:
            raise AssertionError(f"not within {within}s: {what}")
        await asyncio.sleep(0.05)  # another process's state, polled: a pace


async def test_the_groups_node_serves_every_node_s_events_and_moves_with_partition_0(
    cluster: Nodes, database: Database
) -> None:
    serving = await cluster.serving(3)
    first = await lead(cluster, serving)
    other = next(n for n in serving if n is not first)
    async with await Client.connect("127.0.0.1", other.port, timeout=10) as plain:
        with pytest.raises(Moved) as moved:
            await plain.group_create("index")
        assert moved.value.address == cluster.address(first), moved.value
    async with await ClusterClient.connect("127.0.0.1", other.port, timeout=10) as c:
        made = await c.group_create("index", ack_wait=3600, max_deliveries=5)
        assert made["cursor"] == 0, made
        takers = [Taker(c.consume("index")) for _ in range(2)]
        runs = [asyncio.create_task(t.run()) for t in takers]
        users = range(1, 61)  # spread over every node's partitions
        for user in users:
            await c.leave(user)
            await c.rejoin(user)

        async def delivered(n: int) -> bool:
            return len({g[0] for t in takers for g in t.got}) >= n

        await until(lambda: delivered(120), "120 events, from three nodes, delivered")
        await first.kill9()
        serving.remove(first)
        for user in users:
            await c.leave(user)
        second = await lead(cluster, serving)
        assert second is not first

        async def drained() -> bool:
            groups = await c.groups()
            return bool(groups) and groups[0]["pending"] == 0 and groups[0]["lag_events"] == 0

        await until(lambda: delivered(180), "every event delivered after the kill")
        await until(drained, "the group drained on the node that took partition 0")
        [group] = await c.groups()
        assert group["cursor"] == group["last_id"] == 180, group
        for run in runs:
            run.cancel()
        for t in takers:
            await t.consumer.close()
        got = [g for t in takers for g in t.got]
        acked = {i: at for t in takers for i, at in t.acked.items()}
        assert {g[0] for g in got} == set(range(1, 181))
        again = [g for g in got if g[0] in acked and g[3] > acked[g[0]] + 0.5]
        assert not again, f"sent again after its ack was answered: {again[:5]}"
        firsts: dict[int, list[int]] = {}
        for event_id, who, _, _ in sorted(got, key=lambda g: g[3]):
            seen = firsts.setdefault(who or 0, [])
            if event_id not in seen:
                seen.append(event_id)
        out_of_order = {u: ids for u, ids in firsts.items() if ids != sorted(ids)}
        assert not out_of_order, f"a user's events first received out of order: {out_of_order}"
        receipt = await c.receipt(7)
        [leave] = [o for o in receipt["optouts"] if o["event"] == "leave"]
        assert leave["groups"]["index"]["state"] == "acknowledged", receipt
        assert (await c.unconfirmed(older_than=0))["users"] == []
        await c.leave(99)

    def blocking() -> list[tuple[int, int | None]]:
        """The blocking cluster client finds the groups' node from any node too."""
        with SyncClusterClient(cluster.address(other), timeout=10) as sync:
            consumer = sync.consume("index")
            try:
                d = next(consumer)
                d.ack()
                return [(d.id, d.user_id)]
            finally:
                consumer.close()

    assert await asyncio.to_thread(blocking) == [(181, 99)]


async def test_a_paused_groups_node_commits_nothing_more_and_sends_its_consumers_on(
    cluster: Nodes, database: Database
) -> None:
    """The groups' node paused past its session: another takes partition 0 and serves the
    group as committed (what was out is sent again, its count raised from disk); resumed,
    the paused node's ack is refused, and its consumer is ended with ``moved`` naming the
    node that serves the groups now."""
    serving = await cluster.serving(3, "--db-idle-timeout", "2")
    paused = await lead(cluster, serving)
    others = [n for n in serving if n is not paused]
    seeds = ",".join(cluster.address(n) for n in others)
    async with await ClusterClient.connect(seeds, timeout=10) as c:
        await c.group_create("index", ack_wait=3600, max_deliveries=5)
        peer = await GroupPeer.join(("127.0.0.1", paused.port), "index")
        for user in range(1, 6):
            await c.leave(user)
        await peer.until(5)
        error, acked = await peer.call("ack", [1, 2])
        assert error is None and acked["cursor"] == 2, (error, acked)
        assert paused.proc is not None
        paused.proc.send_signal(signal.SIGSTOP)
        try:
            await cluster.settled(others, within=20)
            await c.refresh()  # the map it had names the paused node
            [group] = await c.groups()  # on the node that took partition 0
            assert group["cursor"] == 2 and group["consumers"] == [], group
            taker = Taker(c.consume("index"))
            run = asyncio.create_task(taker.run())
            await until(lambda: _drained(c), "the events out to the paused node sent again")
            run.cancel()
            await taker.consumer.close()
        finally:
            paused.proc.send_signal(signal.SIGCONT)
        assert sorted((g[0], g[2]) for g in taker.got) == [(3, 2), (4, 2), (5, 2)]
        error, _ = await peer.call("ack", [3])
        assert error is not None and error[0] in (2, 4), error  # refused: not its groups now
        assert await peer.closed()
        new = (await cluster.map(others[0]))["owners"][GROUPS][0]
        assert peer.ended is not None and peer.ended[0] == 4, peer.ended
        assert peer.ended[1].endswith(f"served by {new}"), peer.ended
        [group] = await c.groups()
        assert group["cursor"] == 5 and group["pending"] == 0, group


async def _drained(c: ClusterClient) -> bool:
    groups = await c.groups()
    return bool(groups) and groups[0]["cursor"] == 5 and groups[0]["pending"] == 0


async def test_the_tools_reach_the_groups_through_any_node(cluster: Nodes) -> None:
    """``tidal groups``, ``tidal receipt`` and ``tidal watch --group`` given a node that does
    not serve the groups: the first two follow ``moved``; watch consumes at the node the
    partition map names."""
    serving = await cluster.serving(3)
    first = await lead(cluster, serving)
    port = str(next(n for n in serving if n is not first).port)
    async with await ClusterClient.connect("127.0.0.1", int(port), timeout=10) as c:
        await c.group_create("search")
        await c.leave(42)
        async with watching("search", port) as printed:
            shown = await asyncio.wait_for(printed.readline(), 30)
            assert shown.decode().startswith("1 leave at=") and " user_id=42 " in shown.decode()
            await until(lambda: _acknowledged(c), "watch acknowledged what it printed")
    done = await asyncio.to_thread(tidal, "groups", "--port", port)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1].split()[:2] == ["search", "1"], done.stdout
    done = await asyncio.to_thread(tidal, "receipt", "42", "--port", port)
    assert done.returncode == 0 and "acknowledged" in done.stdout, (done.stdout, done.stderr)


async def _acknowledged(c: ClusterClient) -> bool:
    receipt = await c.receipt(42)
    return bool(receipt["optouts"][0]["groups"]["search"]["state"] == "acknowledged")

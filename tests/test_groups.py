"""Consumer groups over real sockets, on both backends: a group shares the feed's work
among its consumers (each event to one, a user's events to one, in order, across a
consumer's loss), sends again what is not acknowledged within ack_wait or whose consumer
went, moves what keeps failing to its dead letters, and never skips silently: events
retention took before the group read them are named in an error until an operator
resets the group. Receipts say, per group, what became of each user's latest opt-outs.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from tidal.client import Client, InvalidParams
from tidal.server import Config, Server

from .conftest import Database
from .group_peer import GroupPeer

pytestmark = pytest.mark.both_backends


@pytest.fixture
async def started(database: Database) -> AsyncIterator[Server]:
    srv = Server(Config(port=0, db=database.target, feed_heartbeat=3600))
    await srv.start()
    yield srv
    await srv.shutdown()


async def until(condition: Callable[[], Awaitable[bool]], what: str) -> None:
    """Polls a state only the server can tell (a consumer joined, a pass of retention)."""
    for _ in range(1000):
        if await condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never reached: {what}")


async def consumers(c: Client, group: str, count: int) -> None:
    async def joined() -> bool:
        found = {g["name"]: g for g in await c.groups()}
        return len(found[group]["consumers"]) == count

    await until(joined, f"{count} consumers in {group}")


async def test_a_group_shares_the_work_each_event_to_one_consumer_a_user_to_one(
    started: Server,
) -> None:
    async with await Client.connect(*started.address, timeout=10) as c:
        await c.group_create("index")
        got: dict[str, list[tuple[int, int | None, int]]] = defaultdict(list)
        done = asyncio.Event()

        async def consume(tag: str) -> None:
            async for d in c.consume("index"):
                got[tag].append((d.id, d.user_id, d.deliveries))
                await d.ack()
                if sum(map(len, got.values())) == 80:
                    done.set()

        tasks = [asyncio.create_task(consume(tag)) for tag in ("a", "b")]
        await consumers(c, "index", 2)
        for user in range(40):
            await c.leave(user)
            await c.rejoin(user)
        await asyncio.wait_for(done.wait(), 10)
        for task in tasks:
            task.cancel()
        ids = sorted(i for events in got.values() for i, _, _ in events)
        assert ids == list(range(1, 81)), "each event went to exactly one consumer"
        assert all(n == 1 for events in got.values() for _, _, n in events)
        assert len(got["a"]) and len(got["b"]), f"one consumer took it all: {dict(got)}"
        owner: dict[int | None, str] = {}
        for tag, events in got.items():
            for _, who, _ in events:
                assert owner.setdefault(who, tag) == tag, f"user {who} went to both"
            for who in {u for _, u, _ in events}:
                mine = [i for i, u, _ in events if u == who]
                assert mine == sorted(mine), f"user {who} out of order: {mine}"
        [index] = await c.groups()
        assert index["cursor"] == 80 and index["pending"] == 0 and index["lag_events"] == 0


async def test_a_lost_consumer_s_events_go_to_the_next_in_order_before_later_ones(
    started: Server,
) -> None:
    """A consumer that crashes between receiving and acknowledging: its events for a user
    are delivered to another, in order, before that user's later events."""
    async with await Client.connect(*started.address, timeout=10) as c:
        await c.group_create("cache", ack_wait=3600)
        first = await GroupPeer.join(started.address, "cache")
        await c.leave(7)
        await c.rejoin(7)
        await c.leave(7)
        await first.until(3)
        assert first.ids() == [1, 2, 3]
        second = await GroupPeer.join(started.address, "cache")
        await c.leave(8)  # another user: it may go to either
        first.close()  # the crash: nothing acknowledged
        await second.until(4)  # user 7's three, and user 8's (sent again if it went first)
        await c.rejoin(7)  # user 7's next event: after the three it waits behind
        seen = await second.until(5)
        sevens = [(e["id"], n) for e, n in seen if e["user_id"] == 7]
        assert sevens == [(1, 2), (2, 2), (3, 2), (5, 1)], seen
        error, acked = await second.call("ack", [1, 2, 3, 5])
        assert error is None and acked["acked"] == 4, error


async def test_unacknowledged_events_are_sent_again_then_dead_lettered_and_redelivered(
    started: Server,
) -> None:
    async with await Client.connect(*started.address, timeout=10) as c:
        await c.group_create("slow", ack_wait="200ms", max_deliveries=2)
        peer = await GroupPeer.join(started.address, "slow")
        await c.leave(3)
        await peer.until(2)  # sent, then sent again once its ack_wait passed
        assert [(e["id"], n) for e, n in peer.got] == [(1, 1), (1, 2)]

        async def dead() -> bool:
            return bool((await c.dead_letters("slow"))["dead_letters"])

        await until(dead, "a dead letter after max_deliveries")
        [letter] = (await c.dead_letters("slow"))["dead_letters"]
        assert letter["id"] == 1 and letter["user_id"] == 3 and letter["deliveries"] == 2
        assert "ack_wait" in letter["reason"], letter
        assert letter["event"]["event"] == "leave"
        [optout] = (await c.receipt(3))["optouts"]
        assert optout["groups"]["slow"]["state"] == "dead_letter", optout
        error, _ = await peer.call("ack", [1])
        assert error is not None and "not pending" in error[1], error  # a dead letter
        assert await c.redeliver("slow", [1]) == 1
        await peer.until(3)
        assert peer.got[2][0]["id"] == 1 and peer.got[2][1] == 1  # counted afresh
        error, _acked = await peer.call("ack", [1])
        assert error is None, error
        [optout] = (await c.receipt(3))["optouts"]
        assert optout["groups"]["slow"]["state"] == "acknowledged", optout
        assert (await c.dead_letters("slow"))["dead_letters"] == []


async def test_nack_delays_or_kills_and_a_user_s_later_events_wait_behind_a_dead_letter(
    started: Server,
) -> None:
    async with await Client.connect(*started.address, timeout=10) as c:
        await c.group_create("waits", ack_wait=3600)
        peer = await GroupPeer.join(started.address, "waits")
        await c.leave(1)
        await peer.until(1)
        error, nacked = await peer.call("nack", [1], {"dead": True, "reason": "bad row"})
        assert error is None and nacked == {"nacked": 1, "dead": 1}, error
        await c.rejoin(1)  # waits behind user 1's dead letter
        await c.leave(2)  # another user's goes on
        await peer.until(2)
        assert peer.got[1][0]["id"] == 3, peer.got
        [letter] = (await c.dead_letters("waits"))["dead_letters"]
        assert letter["reason"] == "bad row"
        await c.redeliver("waits", [1])
        await peer.until(4)
        assert [e["id"] for e, _ in peer.got[2:]] == [1, 2], "the dead letter first, in order"
        error, _ = await peer.call("nack", [1], {"delay": "100ms", "reason": "busy"})
        assert error is None, error
        await peer.until(5)
        assert peer.got[4][0]["id"] == 1 and peer.got[4][1] == 2
        error, acked = await peer.call("ack", [1, 2, 3])
        assert error is None and acked["cursor"] == 3, (error, acked)


async def test_bad_group_requests_are_refused_and_change_nothing(started: Server) -> None:
    async with await Client.connect(*started.address, timeout=10) as c:
        await c.group_create("a", ack_wait=3600)
        peer = await GroupPeer.join(started.address, "a")
        await c.leave(1)
        await peer.until(1)
        other = await GroupPeer.join(started.address, "a")
        before = await c.groups()
        for call, words in [
            (c.group_create("a"), "exists already"),
            (c.group_create("x" * 129), "1..128 bytes"),
            (c.group_create("b", ack_wait="soon"), "options.ack_wait"),
            (c.group_create("b", max_deliveries=0), "options.max_deliveries"),
            (c.group_create("b", from_id=99), "past the last event id"),
            (c.group_drop("nope"), "no group named 'nope'"),
            (c.group_reset("nope"), "no group named 'nope'"),
            (c.dead_letters("nope"), "no group named 'nope'"),
            (c.redeliver("a", [1]), "no dead letter"),
            (c.call("ack", [1]), "consumes no group"),
            (c.call("subscribe", {"group": "nope"}), "no group named 'nope'"),
            (c.unconfirmed("nope"), "no group named 'nope'"),
        ]:
            with pytest.raises(InvalidParams) as refused:
                await call
            assert words in refused.value.message, refused.value.message
        for ids, words in [([99], "not pending"), ([1, 1], "given twice"), ([], "1..1000")]:
            error, _ = await peer.call("ack", ids)
            assert error is not None and words in error[1], error
        error, _ = await other.call("ack", [1])
        assert error is not None and "another consumer" in error[1], error
        error, _ = await other.call("nack", [1], {"delay": 5})
        assert error is not None and "another consumer" in error[1], error
        after = await c.groups()
        timings = ("lag_seconds", "oldest_unacked_seconds")
        assert [{k: v for k, v in g.items() if k not in timings} for g in after] == [
            {k: v for k, v in g.items() if k not in timings} for g in before
        ]
        assert await c.group_drop("a")
        assert await peer.closed() and "was dropped" in peer.ended[1], peer.ended
        with pytest.raises(InvalidParams, match="no group named 'a'"):
            await c.group_drop("a")


async def test_receipts_and_unconfirmed_say_what_each_group_did_with_an_opt_out(
    started: Server,
) -> None:
    async with await Client.connect(*started.address, timeout=10) as c:
        await c.group_create("search", ack_wait=3600)
        await c.group_create("warehouse", ack_wait=3600)
        search = await GroupPeer.join(started.address, "search")
        await c.leave(42)
        await c.purge(42)
        await c.signal(42, "e", "view")  # no event: signals are not opt-outs
        await search.until(2)
        error, _ = await search.call("ack", search.ids())
        assert error is None, error
        receipt = await c.receipt(42)
        assert [o["event"] for o in receipt["optouts"]] == ["leave", "purge"]
        for optout in receipt["optouts"]:
            assert optout["groups"]["search"]["state"] == "acknowledged"
            assert optout["groups"]["search"]["at_ns"] >= optout["at_ns"]
            assert optout["groups"]["warehouse"] == {
                "state": "pending", "since_ns": optout["at_ns"], "deliveries": 0,
            }  # fmt: skip
        assert (await c.receipt(43))["optouts"] == []
        waiting = await c.unconfirmed("warehouse")
        assert [(u["user_id"], u["event"], u["groups"]) for u in waiting["users"]] == [
            (42, "leave", ["warehouse"]), (42, "purge", ["warehouse"]),
        ]  # fmt: skip
        assert (await c.unconfirmed("search"))["users"] == []
        assert (await c.unconfirmed(older_than="1h"))["users"] == []
        await c.group_create("later")  # made after the opt-outs: it has no word on them
        assert "later" not in (await c.receipt(42))["optouts"][0]["groups"]


async def test_events_retention_took_before_a_group_read_them_are_named_until_reset(
    database: Database,
) -> None:
    srv = Server(Config(port=0, db=database.target, event_retention=0.5, feed_heartbeat=3600))
    await srv.start()
    try:
        async with await Client.connect(*srv.address, timeout=10) as c:
            for user in range(5):
                await c.leave(user)
            retention = srv.engine.event_retention

            async def retired() -> bool:
                return retention.retired == 5

            await until(retired, "retention deleting the five events")
            await c.group_create("late", from_id=0)
            await c.leave(9)  # kept: event 6

            async def told() -> bool:
                return (await c.groups())[0]["lost"] is not None

            await until(told, "the group finding what it lost")
            [late] = await c.groups()
            assert late["lost"] == [1, 5], late
            with pytest.raises(InvalidParams) as refused:
                await c.call("subscribe", {"group": "late"})
            assert refused.value.data == {"lost": [1, 5]}, refused.value.data
            assert "lost events 1..5" in refused.value.message
            assert await c.group_reset("late", 5) == 5  # past what it lost
            peer = await GroupPeer.join(srv.address, "late")
            await peer.until(1)
            assert peer.ids() == [6]
    finally:
        await srv.shutdown()


async def test_acks_ride_in_the_next_write_s_commit_not_one_of_their_own(
    started: Server,
) -> None:
    """One client writing one leave at a time, one consumer acknowledging each event as it
    comes: the acks wait a moment for the next leave and share its commit (``linger``),
    rather than put a commit of their own before it. Without that, a commit each: twice
    as many."""
    async with await Client.connect(*started.address, timeout=10) as c:
        await c.group_create("index")
        acked: list[int] = []

        async def consume() -> None:
            async for d in c.consume("index"):
                await d.ack()
                acked.append(d.id)

        task = asyncio.create_task(consume())
        await consumers(c, "index", 1)
        before = (await c.stats())["commits"]
        for user in range(1, 101):
            await c.leave(user)
        await until(lambda: _settled(acked, 100), "every leave acknowledged")
        commits = (await c.stats())["commits"] - before
        task.cancel()
    assert commits <= 125, f"{commits} commits for 100 leaves and their 100 acks"


async def _settled(acked: list[int], count: int) -> bool:
    return len(acked) >= count

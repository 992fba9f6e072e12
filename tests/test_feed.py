"""The change feed over real sockets: every leave, rejoin, purge, erase and cohort change is
an event with an id one past the last, pushed to every subscriber before its write is
acknowledged, and replayable from any id kept, across restarts and on both backends."""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import aio_msgpack_rpc
import msgpack
import pytest

from tidal.client import Client
from tidal.server import Config, Server

from .conftest import Database
from .rawrpc import RawPeer

pytestmark = pytest.mark.both_backends


@pytest.fixture
async def started(database: Database) -> AsyncIterator[Server]:
    srv = Server(Config(port=0, db=database.target, feed_heartbeat=3600))
    await srv.start()
    yield srv
    await srv.shutdown()


class Listener:
    """A subscriber on a plain blocking socket, read only when asked: what the kernel
    holds for it is exactly what the server has sent."""

    def __init__(self, port: int, options: dict[str, Any] | None = None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        self.sock.sendall(msgpack.packb([0, 1, "subscribe", [options or {}]]))
        reply = self.next()
        assert reply[:3] == [1, 1, None], reply
        self.last_id: int = reply[3]["last_id"]
        self.events: list[dict[str, Any]] = []

    def next(self) -> Any:
        while True:
            for obj in self.unpacker:
                return obj
            data = self.sock.recv(1 << 16)
            assert data, "the server closed the subscriber"
            self.unpacker.feed(data)

    def held(self) -> list[dict[str, Any]]:
        """The events the kernel already holds for this socket, without waiting."""
        while select.select([self.sock], [], [], 0)[0]:
            data = self.sock.recv(1 << 16)
            if not data:
                break
            self.unpacker.feed(data)
        for obj in self.unpacker:
            if obj[:2] == [2, "event"]:
                self.events.append(obj[2][0])
        return self.events

    def until(self, n: int) -> list[dict[str, Any]]:
        while len(self.events) < n:
            obj = self.next()
            if obj[:2] == [2, "event"]:
                self.events.append(obj[2][0])
        return self.events

    def close(self) -> None:
        self.sock.close()


def call(sock: socket.socket, unpacker: msgpack.Unpacker, method: str, *params: Any) -> Any:
    sock.sendall(msgpack.packb([0, 9, method, list(params)]))
    while True:
        for obj in unpacker:
            assert obj[0] == 1, obj
            return obj
        unpacker.feed(sock.recv(1 << 16))


def without_times(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in e.items() if not k.endswith("_ns")} for e in events]


async def test_each_change_is_one_event_and_signals_are_none(started: Server) -> None:
    async with await Client.connect(*started.address) as c:
        await c.signal(1, "e", "view", communities=["jazz"])
        await c.signal(1, "e", "like")
        leave = await c.leave(1)
        await c.signal(1, "e", "view")  # gated, still no event
        purge = await c.purge(1)
        assert await c.define_cohort("de", {"country": "de"})
        assert await c.define_cohort("de", {"country": "de"})  # no change: no event
        await c.leave(2, purge=True)
        erase = await c.erase(3)
        await c.rejoin(1)
        await c.rejoin(1)  # already active: no event
        assert await c.drop_cohort("de")
        assert not await c.drop_cohort("de")
        got = []
        async with c.subscribe(from_id=0) as feed:
            async for event in feed:
                got.append(event)
                if event.event == "drop_cohort":
                    break
    assert without_times([e.wire() for e in got]) == [
        {"id": 1, "event": "leave", "user_id": 1},
        {"id": 2, "event": "purge", "user_id": 1, "purged": 2},  # the gated one counted nowhere
        {"id": 3, "event": "define_cohort", "name": "de", "predicate": {"country": "de"}},
        {"id": 4, "event": "leave", "user_id": 2},  # a leave with purge: two events
        {"id": 5, "event": "purge", "user_id": 2, "purged": 0},
        {"id": 6, "event": "erase", "user_id": 3, "erased": 0},
        {"id": 7, "event": "rejoin", "user_id": 1},
        {"id": 8, "event": "drop_cohort", "name": "de"},
    ]
    assert got[0].left_at_ns == got[0].at_ns == leave.left_at_ns
    assert got[1].at_ns == purge.at_ns and got[1].purged == purge.signals
    left_at = got[5].left_at_ns
    assert got[5].at_ns == erase.at_ns and left_at is not None and left_at < erase.at_ns
    assert got[6].left_at_ns == leave.left_at_ns  # a rejoin keeps when they left
    times = [e.at_ns for e in got]
    assert times == sorted(times) and len(set(times)) == len(times)


async def test_the_event_is_on_the_subscribers_socket_before_the_ack(
    started: Server,
) -> None:
    """Whoever reads the ack of a leave finds every connected subscriber already sent it."""
    port = started.address[1]

    def leaves() -> None:
        listeners = [Listener(port) for _ in range(3)]
        writer = socket.create_connection(("127.0.0.1", port), timeout=10)
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        for user in range(1, 21):
            reply = call(writer, unpacker, "leave", user)
            assert reply[2] is None, reply
            for listener in listeners:  # read the ack: the event is there, or this fails
                held = listener.held()
                assert held and held[-1]["user_id"] == user, (user, held[-3:])
        writer.close()
        for listener in listeners:
            listener.close()

    await asyncio.to_thread(leaves)  # blocking sockets, off the loop the server runs on


async def test_pipelined_writes_from_two_connections_are_sent_before_each_ack(
    started: Server,
) -> None:
    port = started.address[1]

    def pipelined() -> None:
        listener = Listener(port)
        writers = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(2)]
        per = 200
        for w, sock in enumerate(writers):  # all sent before any ack is read
            requests = [[0, i, "leave", [w * 1000 + i]] for i in range(per)]
            requests += [[0, per + i, "purge", [w * 1000 + i]] for i in range(per)]
            sock.sendall(b"".join(msgpack.packb(r) for r in requests))
        unpackers = [msgpack.Unpacker(raw=False, strict_map_key=False) for _ in writers]
        acked = 0
        while acked < 2 * 2 * per:
            ready, _, _ = select.select(writers, [], [], 10)
            assert ready, "no acks for 10 s"
            for sock in ready:
                u = unpackers[writers.index(sock)]
                u.feed(sock.recv(1 << 16))
                for reply in u:
                    assert reply[2] is None, reply
                    acked += 1
                    msgid = reply[1]
                    user = writers.index(sock) * 1000 + msgid % per
                    event = "leave" if msgid < per else "purge"
                    held = {(e["event"], e["user_id"]) for e in listener.held()}
                    assert (event, user) in held, (event, user)
        ids = [e["id"] for e in listener.events]
        assert ids == list(range(1, 4 * per + 1))
        listener.close()
        for sock in writers:
            sock.close()

    await asyncio.to_thread(pipelined)


async def test_a_replay_then_live_with_no_gap_and_no_duplicate(
    started: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``from`` replays the table page by page while writes go on, then continues live:
    ids one past the other all the way through."""
    monkeypatch.setattr("tidal.server.core.feed.PAGE", 7)
    async with await Client.connect(*started.address) as c:
        for user in range(40):
            await c.leave(user)
        more = asyncio.create_task(_leaves(c, range(100, 160)))
        got = []
        async with contextlib.aclosing(c.subscribe(from_id=5)) as feed:
            async for event in feed:
                got.append(event.id)
                if event.id == 100:
                    break
        await more
    assert got == list(range(6, 101))


async def _leaves(c: Client, users: range) -> None:
    for user in users:
        await c.leave(user)


async def test_only_the_events_asked_for(started: Server) -> None:
    async with await Client.connect(*started.address) as c:
        await c.leave(1)
        await c.purge(1)
        await c.rejoin(1)
        await c.erase(2)
        peer = await RawPeer.open(started.address)
        reply = await peer.call("subscribe", {"from": 0, "events": ["erase", "rejoin"]})
        assert reply == [1, 1, None, {"last_id": 4}]
        await c.leave(3)
        await c.erase(3)
        got = [(await peer.receive())[2][0] for _ in range(3)]
        assert [(e["id"], e["event"]) for e in got] == [(3, "rejoin"), (4, "erase"), (6, "erase")]
        peer.close()


async def test_a_subscribed_connection_still_makes_calls(started: Server) -> None:
    peer = await RawPeer.open(started.address)
    assert (await peer.call("subscribe"))[3] == {"last_id": 0}
    peer.send([0, 2, "leave", [5]])
    first, second = await peer.receive(), await peer.receive()
    # its own leave: the event, then the ack
    assert first[:2] == [2, "event"] and first[2][0]["user_id"] == 5, first
    assert second[:3] == [1, 2, None] and second[3]["status"] == "left", second
    assert (await peer.call("status", 5, msgid=3))[3]["status"] == "left"
    assert await peer.call("unsubscribe", msgid=4) == [1, 4, None, True]
    assert await peer.call("unsubscribe", msgid=5) == [1, 5, None, False]
    assert (await peer.call("leave", 6, msgid=6))[:3] == [1, 6, None]  # no event now
    assert (await peer.call("stats", msgid=7))[3]["last_event_id"] == 2
    peer.close()


async def test_a_stock_client_that_takes_no_notifications_is_still_served(
    started: Server,
) -> None:
    """aio-msgpack-rpc logs a notification and ignores it: subscribed, its calls still work."""
    reader, writer = await asyncio.open_connection(*started.address)
    rpc = aio_msgpack_rpc.Client(reader, writer, response_timeout=10)
    try:
        assert await rpc.call("subscribe") == {"last_id": 0}
        left = await rpc.call("leave", 5)  # its event arrives first, and is passed over
        assert left["status"] == "left"
        assert (await rpc.call("status", 5))["status"] == "left"
        assert (await rpc.call("stats"))["last_event_id"] == 1
    finally:
        rpc.close()


@pytest.mark.parametrize(
    ("params", "names"),
    [
        ([{"from": "3"}], "options.from"),
        ([{"from": -1}], "options.from"),
        ([{"from": True}], "options.from"),
        ([{"from": 99}], "options.from: 99 is past the last event id, 0"),
        ([{"events": ["leave", "signal"]}], "options.events[1]: unknown event 'signal'"),
        ([{"events": []}], "options.events"),
        ([{"events": "leave"}], "options.events"),
        ([{"since": 3}], "unknown key 'since'"),
        (["all"], "options: must be a map"),
        ([{}, {}], "subscribe takes 0 to 1 params"),
    ],
)
async def test_bad_options_are_refused_naming_them(
    started: Server, params: list[Any], names: str
) -> None:
    peer = await RawPeer.open(started.address)
    reply = await peer.call("subscribe", *params)
    assert reply[2][0] == -32602 and names in reply[2][1], reply
    assert (await peer.call("subscribe", msgid=2))[2] is None  # and nothing was half-done
    again = await peer.call("subscribe", msgid=3)
    assert again[2][0] == -32602 and "subscribed already" in again[2][1], again
    peer.close()


async def test_heartbeats_and_stats(database: Database) -> None:
    srv = Server(Config(port=0, db=database.target, feed_heartbeat=0.05))
    await srv.start()
    try:
        peer = await RawPeer.open(srv.address)
        await peer.call("subscribe")
        async with await Client.connect(*srv.address) as c:
            await c.leave(1)
            while (first := await peer.receive())[1] == "heartbeat":  # a slow connect or leave
                assert first == [2, "heartbeat", [{"last_id": 0}]], first
            assert first[:2] == [2, "event"]
            seen = [await peer.receive() for _ in range(2)]
            assert seen == [[2, "heartbeat", [{"last_id": 1}]]] * 2
            stats = await c.stats()
            assert (stats["subscribers"], stats["last_event_id"]) == (1, 1)
            peer.send([0, 2, "unsubscribe", []])
            while (reply := await peer.receive())[0] != 1:  # heartbeats may come first
                assert reply[:2] == [2, "heartbeat"], reply
            assert reply == [1, 2, None, True]
            assert (await c.stats())["subscribers"] == 0
            peer.close()
    finally:
        await srv.shutdown()


async def test_subscribe_obeys_auth(database: Database) -> None:
    srv = Server(Config(port=0, db=database.target, token="s3cret"))
    await srv.start()
    try:
        peer = await RawPeer.open(srv.address)
        refused = await peer.call("subscribe")
        assert refused[2][0] == 1 and "unauthorized" in refused[2][1], refused
        assert (await peer.call("auth", "s3cret", msgid=2))[3] is True
        assert (await peer.call("subscribe", msgid=3))[3] == {"last_id": 0}
        async with await Client.connect(*srv.address, token="s3cret") as c:
            await c.leave(1)
        assert (await peer.receive())[2][0]["user_id"] == 1
        peer.close()
    finally:
        await srv.shutdown()


async def _load(address: tuple[str, int], first: int, rounds: int) -> None:
    """Leaves, pipelined 200 at a time: volume for the feed, from writers that only write."""
    peer = await RawPeer.open(address)
    for r in range(rounds):
        for i in range(200):
            peer.send([0, i, "leave", [first + r * 200 + i]])
        for _ in range(200):
            reply = await peer.receive()
            assert reply[2] is None, reply
    peer.close()


async def _probe(c: Client, first: int, until: asyncio.Task[Any]) -> list[float]:
    """One writer's latency, a leave at a time, while ``until`` runs."""
    latencies = []
    user = first
    while not until.done():
        began = time.perf_counter()
        await c.leave(user)
        latencies.append(time.perf_counter() - began)
        user += 1
    return latencies


def p99(values: list[float]) -> float:
    return sorted(values)[int(len(values) * 0.99)]


async def test_a_subscriber_that_does_not_read_is_closed_and_writers_keep_their_pace(
    started: Server,
) -> None:
    address = started.address
    async with await Client.connect(*address) as c:
        load = asyncio.gather(*(_load(address, k * 10**6, 80) for k in range(1, 5)))
        alone = await _probe(c, 1, asyncio.ensure_future(load))
        stuck = socket.socket()
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # reads nothing, holds little
        stuck.connect(address)
        stuck.sendall(msgpack.packb([0, 1, "subscribe", []]))
        load = asyncio.gather(*(_load(address, k * 10**6, 80) for k in range(5, 9)))
        beside = await _probe(c, 10**5, asyncio.ensure_future(load))
        feed = started.engine.feed
        assert feed.lagged == 1, "the subscriber was never closed for lagging"
        assert len(feed) == 0

        def read_all() -> list[Any]:
            stuck.settimeout(10)
            unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
            while data := stuck.recv(1 << 20):
                unpacker.feed(data)
            return list(unpacker)

        got = await asyncio.to_thread(read_all)
        stuck.close()
        assert got[0] == [1, 1, None, {"last_id": got[1][2][0]["id"] - 1}]
        events = [m[2][0]["id"] for m in got[1:-1]]
        assert [m[0:2] for m in got[1:-1]] == [[2, "event"]] * len(events)
        assert events == list(range(events[0], events[0] + len(events)))
        assert got[-1] == [2, "lagging", [{"last_sent": events[-1]}]]
        # what it missed is replayed from where it stopped, with nothing skipped
        async with c.subscribe(from_id=events[-1]) as resumed:
            async for event in resumed:
                assert event.id == events[-1] + 1
                break
    assert p99(beside) <= 2 * p99(alone) + 0.002, (p99(alone), p99(beside))


async def test_a_subscribe_sent_as_a_notification_replays_too(database: Database) -> None:
    """With one request in flight at most, a notification whose place were never given back
    would stop the connection for good."""
    srv = Server(Config(port=0, db=database.target, max_inflight=1, feed_heartbeat=3600))
    await srv.start()
    try:
        async with await Client.connect(*srv.address) as c:
            await c.leave(1)
            await c.leave(2)
        peer = await RawPeer.open(srv.address)
        peer.send([2, "subscribe", [{"from": 1}]])
        assert (await peer.receive())[2][0]["id"] == 2
        assert await peer.call("ping") == [1, 1, None, "pong"]
        assert (await peer.call("stats", msgid=2))[3]["subscribers"] == 1
        peer.close()
    finally:
        await srv.shutdown()

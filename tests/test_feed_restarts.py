"""The change feed across what ends a server: SIGTERM, kill -9, a refused commit, retention,
and the clients and ``tidal watch`` resuming by themselves across a restart."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest

from tidal.client import Client, FeedEvent, FeedGap, SyncClient, Unavailable
from tidal.server import Config, Server
from tidal.testing.postgres import Cluster

from .conftest import Database, ServerProcess, tmpfs
from .rawrpc import RawPeer
from .test_disk_full import fill
from .test_feed import _load


def free_port() -> int:
    """A port to restart a server on, so that its clients find it again."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def replay(port: int, after: int = 0) -> list[dict[str, Any]]:
    """Every event after ``after`` that the server keeps, read with ``from``."""
    peer = await RawPeer.open(("127.0.0.1", port))
    reply = await peer.call("subscribe", {"from": after})
    assert reply[2] is None, reply
    events: list[dict[str, Any]] = []
    while len(events) < reply[3]["last_id"] - after:
        note = await peer.receive()
        assert note[:2] == [2, "event"], note
        events.append(note[2][0])
    peer.close()
    return events


async def writer(
    port: int, first: int, acked: list[tuple[str, int]], sent: set[int], enough: asyncio.Event
) -> None:
    """Leaves and purges, pipelined, until the connection drops; what was acked is kept."""
    peer = await RawPeer.open(("127.0.0.1", port))
    user = first
    try:
        while True:
            for i in range(50):
                sent.add(user + i)
                peer.send([0, 2 * i, "leave", [user + i]])
                peer.send([0, 2 * i + 1, "purge", [user + i]])
            for _ in range(100):
                reply = await peer.receive()
                if reply is None:
                    return
                assert reply[2] is None, reply
                i, purge = divmod(reply[1], 2)
                acked.append(("purge" if purge else "leave", user + i))
            if len(acked) >= 600:
                enough.set()
            user += 50
    except (ConnectionError, asyncio.IncompleteReadError):
        return


@pytest.mark.both_backends
@pytest.mark.parametrize("how", ["sigterm", "kill9"])
async def test_replay_after_a_stop_has_every_acked_event_in_order(
    process: ServerProcess, how: str
) -> None:
    await process.start()
    acked: list[tuple[str, int]] = []
    sent: set[int] = set()
    enough = asyncio.Event()
    tasks = [
        asyncio.create_task(writer(process.port, k * 1_000_000, acked, sent, enough))
        for k in range(3)
    ]
    await asyncio.wait_for(enough.wait(), 30)
    if how == "kill9":
        await process.kill9()
    else:
        assert await process.stop() == 0
    await asyncio.gather(*tasks)
    await process.start()
    events = await replay(process.port)
    assert [e["id"] for e in events] == list(range(1, len(events) + 1))  # no gap, in order
    got = [(e["event"], e["user_id"]) for e in events]
    assert set(acked) <= set(got)  # every acknowledged one
    assert {user for _, user in got} <= sent  # none that was not asked for
    if how == "sigterm":  # everything read was committed and answered: exactly the acked
        assert sorted(got) == sorted(acked)
    else:  # committed as the process died, its ack unsent: on disk, so in the feed
        async with await process.connect() as c:
            for event, user in set(got) - set(acked):
                assert (await c.status(user)).left, (event, user)
    async with await process.connect() as c:  # ids go on after the restart
        await c.leave(7)
    assert [e["id"] for e in await replay(process.port, len(events))] == [len(events) + 1]


async def test_a_refused_commit_gives_its_ids_back(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk", "3m") as disk:
        server = Server(Config(port=0, db=str(disk / "tidal.db"), feed_heartbeat=3600))
        await server.start()
        try:
            peer = await RawPeer.open(server.address)
            await peer.call("subscribe")
            async with await Client.connect(*server.address) as c:
                await c.leave(1)
                filler = fill(disk, leave=64 * 1024)
                refused = None
                for user in range(2, 10_000):
                    try:
                        await c.signal(user, "e", "view", attrs={"pad": "x" * 200})
                        await c.leave(user)
                    except Unavailable as exc:
                        refused = exc
                        break
                assert refused is not None, "the disk never filled up"
                filler.unlink()
                assert (await c.health())["status"] == "ok"
                await c.leave(10_001)
            events: list[dict[str, Any]] = []
            while not events or events[-1]["user_id"] != 10_001:
                note = await peer.receive()
                assert note[:2] == [2, "event"], note
                events.append(note[2][0])
            assert [e["id"] for e in events] == list(range(1, len(events) + 1))
            assert [e["user_id"] for e in events] == [*range(1, len(events)), 10_001]
            peer.close()
        finally:
            await server.shutdown()


class Clock:
    def __init__(self) -> None:
        self.offset = 0

    def __call__(self) -> int:
        return time.time_ns() + self.offset


@pytest.mark.both_backends
async def test_retention_and_a_from_too_old(database: Database) -> None:
    clock = Clock()
    config = Config(port=0, db=database.target, event_retention=10.0, feed_heartbeat=3600)
    server = Server(config, clock=clock)
    await server.start()
    try:
        async with await Client.connect(*server.address) as c:
            for user in range(1, 6):
                await c.leave(user)
            retention = server.engine.event_retention
            retention.caught_up.clear()
            clock.offset += 20 * 10**9  # those five are now old
            for user in range(6, 9):
                await c.leave(user)
            await asyncio.wait_for(retention.caught_up.wait(), 10)
            assert retention.retired == 5
            peer = await RawPeer.open(server.address)
            refused = await peer.call("subscribe", {"from": 2})
            assert refused[2][0] == -32602, refused
            assert "the oldest kept is 6" in refused[2][1] and "--event-retention" in refused[2][1]
            peer.close()
            with pytest.raises(FeedGap) as gap:
                async for _ in c.subscribe(from_id=0):
                    pass
            assert gap.value.oldest == 6
            assert [e["id"] for e in await replay(server.address[1], 5)] == [6, 7, 8]
            retention.caught_up.clear()
            clock.offset += 20 * 10**9  # now all of them
            await asyncio.wait_for(retention.caught_up.wait(), 10)
    finally:
        await server.shutdown()
    server = Server(config, clock=clock)  # every event deleted: ids still go on
    await server.start()
    try:
        async with await Client.connect(*server.address) as c:
            assert (await c.stats())["last_event_id"] == 8
            await c.leave(9)
        assert [e["id"] for e in await replay(server.address[1], 8)] == [9]
    finally:
        await server.shutdown()


@pytest.mark.both_backends
async def test_a_replay_whose_reader_stops_is_closed_and_retention_goes_on(
    database: Database,
) -> None:
    """A replay from 0 whose reader takes nothing is told ``lagging`` and closed, as a live
    subscriber is, and retention then deletes what it held back (issue 39, item 9: it was
    never closed, and every event since its position was kept for ever)."""
    clock = Clock()
    config = Config(port=0, db=database.target, event_retention=10.0, feed_heartbeat=0.05)
    server = Server(config, clock=clock)
    await server.start()
    try:
        # 60,000 leaves: a replay from 0 fills this machine's socket buffers at about 39,000
        await _load(server.address, 1, 300)
        stuck = socket.socket()
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # reads nothing
        stuck.connect(server.address)
        stuck.sendall(msgpack.packb([0, 1, "subscribe", [{"from": 0}]]))
        feed = server.engine.feed
        async with await Client.connect(*server.address) as c:
            for _ in range(600):  # the state, polled: what the server has closed
                if not (await c.stats())["subscribers"] and feed.lagged:
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the stalled replay was never closed in 30 s")
            clock.offset += 20 * 10**9  # every event is old now
            await c.leave(60_001)
            retention = server.engine.event_retention
            for _ in range(30):  # retention passes, each awaited (a pass that took its
                retention.caught_up.clear()  # cutoff before the clock moved retires nothing)
                await asyncio.wait_for(retention.caught_up.wait(), 10)
                if retention.retired == 60_000:
                    break
            assert retention.retired == 60_000, "retention still held back at the replay's position"

        def read_all() -> list[Any]:
            stuck.settimeout(10)
            unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
            while data := stuck.recv(1 << 20):
                unpacker.feed(data)
            return list(unpacker)

        got = await asyncio.to_thread(read_all)
        stuck.close()
        assert got[0] == [1, 1, None, {"last_id": 60_000}]
        events = [m[2][0]["id"] for m in got[1:-1] if m[:2] == [2, "event"]]
        assert all(m[:2] in ([2, "event"], [2, "heartbeat"]) for m in got[1:-1])
        assert 0 < len(events) < 60_000 and events == list(range(1, len(events) + 1))
        assert got[-1] == [2, "lagging", [{"last_sent": events[-1]}]]
    finally:
        await server.shutdown()


@pytest.mark.both_backends
async def test_the_async_client_resumes_across_a_restart(database: Database) -> None:
    port = free_port()
    process = ServerProcess(database.target, "--port", str(port), "--feed-heartbeat", "0.2")
    await process.start()
    got: list[FeedEvent] = []
    try:
        async with await process.connect() as c:
            feed = c.subscribe(from_id=0, events=["leave"])
            for user in range(1, 6):
                await c.leave(user)
                await c.purge(user)  # not asked for
            async for event in feed:
                got.append(event)
                if len(got) == 5:
                    break
            assert await process.stop() == 0
            await process.start()
            for user in range(6, 11):
                await c.leave(user)  # the client reconnects
            async for event in feed:
                got.append(event)
                if len(got) == 10:
                    break
            await feed.close()
    finally:
        await process.stop(signal.SIGKILL)
    assert [e.user_id for e in got] == list(range(1, 11))
    assert [e.id for e in got] == [1, 3, 5, 7, 9, 11, 12, 13, 14, 15]  # purges not asked for


def test_the_blocking_client_resumes_across_a_restart(tmp_path: Path) -> None:
    from .conftest import BlockingServer

    port = free_port()
    server = BlockingServer(tmp_path / "tidal.db", "--port", str(port)).start()
    got: list[FeedEvent] = []
    try:
        with SyncClient("127.0.0.1", port, timeout=10) as c:
            feed = c.subscribe(from_id=0)
            for user in range(1, 4):
                c.leave(user)
            for event in feed:
                got.append(event)
                if len(got) == 3:
                    break
            assert server.stop() == 0
            server.start()
            for user in range(4, 7):
                c.leave(user)
            for event in feed:
                got.append(event)
                if len(got) == 6:
                    break
            feed.close()
    finally:
        server.stop(signal.SIGKILL)
    assert [(e.id, e.user_id) for e in got] == [(u, u) for u in range(1, 7)]


def ctrl_c() -> None:
    """In the child, before it runs: SIGINT as a terminal delivers it. Started from a
    background job of a non-interactive shell (``make test &``, CI runners), this test
    process ignores SIGINT, and so would a child it starts: a Python that starts with SIGINT
    ignored keeps ignoring it, as it should, and ``tidal watch`` never saw its Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


async def test_tidal_watch_prints_each_event_as_it_happens(process: ServerProcess) -> None:
    await process.start()
    async with await process.connect() as c:
        await c.leave(1)
        watch = await asyncio.create_subprocess_exec(
            sys.executable, "-X", "faulthandler", "-m", "tidal.cli", "watch",
            "--port", str(process.port), "--from", "0", "--events", "leave,erase", "--json",
            stdout=asyncio.subprocess.PIPE, preexec_fn=ctrl_c,
        )  # fmt: skip
        assert watch.stdout is not None
        await c.rejoin(1)
        await c.erase(2)
        lines = [json.loads(await asyncio.wait_for(watch.stdout.readline(), 10)) for _ in range(2)]
        assert [(e["id"], e["event"], e["user_id"]) for e in lines] == [
            (1, "leave", 1),
            (3, "erase", 2),
        ]
        watch.send_signal(signal.SIGINT)
        try:
            assert await asyncio.wait_for(watch.wait(), 10) == 0
        except TimeoutError:  # where does it hang?
            watch.send_signal(signal.SIGABRT)  # faulthandler prints its threads' stacks
            await watch.wait()
            raise AssertionError(
                "tidal watch did not exit in 10 s after SIGINT; its stacks are in the"
                " captured stderr"
            ) from None
        text = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tidal.cli", "watch", "--port", str(process.port), "--from", "2",
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert text.stdout is not None
        line = (await asyncio.wait_for(text.stdout.readline(), 10)).decode()
        assert line.startswith("3 erase ") and "user_id=2" in line and "erased=0" in line, line
        assert re.search(r" at=20\d\d-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", line), line
        text.kill()
        await text.wait()
        gone = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tidal.cli", "watch", "--port", str(process.port),
            "--events", "leave,signal", stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await gone.communicate()
        assert gone.returncode == 2 and b"--events: unknown signal" in err, err


@pytest.mark.parametrize("backend", ["postgresql"])
async def test_a_replay_goes_on_across_the_database_stopped_and_started(
    pg_cluster: Cluster, database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pages read while the database is away fail with their commits; the replay waits, and
    goes on from where it was once the database is back: every event, once, in order."""
    monkeypatch.setattr("tidal.server.core.feed.PAGE", 2)
    server = Server(Config(port=0, db=database.target, feed_heartbeat=0.1))
    await server.start()
    big = {"a": [f"{i:03}" + "x" * 240 for i in range(250)]}  # about 62 KiB an event
    try:
        async with await Client.connect(*server.address) as c:
            for i in range(75):  # 150 events, over 4.5 MiB: more than the socket buffers hold
                await c.define_cohort(f"c{i}", big)
                await c.drop_cohort(f"c{i}")
        reader = socket.socket()
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        reader.connect(server.address)
        reader.sendall(msgpack.packb([0, 1, "subscribe", [{"from": 0}]]))
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        ids: list[int] = []

        def read(until: int | None, timeout: float) -> None:
            """Up to ``until`` events in ``timeout``; with None, what comes until no event
            has come for ``timeout`` (heartbeats come meanwhile)."""
            reader.settimeout(0.2)
            last = time.monotonic()
            while until is None or len(ids) < until:
                if time.monotonic() - last > timeout:
                    assert until is None, f"{len(ids)} events after {timeout} s, not {until}"
                    return
                try:
                    data = reader.recv(1 << 20)
                except TimeoutError:
                    continue
                assert data, "the server closed the subscriber"
                unpacker.feed(data)
                for message in unpacker:
                    if message[:2] == [2, "event"]:
                        ids.append(message[2][0]["id"])
                        if until is None:
                            last = time.monotonic()
                    else:
                        assert message[0] == 1 or message[1] == "heartbeat", message

        await asyncio.to_thread(read, 1, 10)  # the replay has begun, and waits for the reader
        await asyncio.to_thread(pg_cluster.stop, "immediate")
        try:
            await asyncio.to_thread(read, None, 2.0)  # what was sent; no page comes meanwhile
            assert len(ids) < 150, "the replay ended before the database stopped: proves nothing"
        finally:
            await asyncio.to_thread(pg_cluster.start)
        await asyncio.to_thread(read, 150, 30)
        reader.close()
        assert ids == list(range(1, 151))
    finally:
        await server.shutdown()


async def test_tidal_watch_resumes_after_a_restart_longer_than_its_clients_retries(
    db_path: Path,
) -> None:
    """It gave up after 6.4 s of silence ("could not resubscribe"), though its help said it
    resumes after a restart. Now it tries again with a growing pause until interrupted,
    saying so, and goes on from the last event it printed."""
    port = free_port()
    process = ServerProcess(db_path, "--port", str(port))
    await process.start()
    async with await process.connect() as c:
        await c.leave(1)
    watch = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tidal.cli", "watch", "--port", str(port), "--from", "0", "--json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, preexec_fn=ctrl_c,
    )  # fmt: skip
    assert watch.stdout is not None and watch.stderr is not None
    try:
        first = json.loads(await asyncio.wait_for(watch.stdout.readline(), 10))
        assert (first["id"], first["event"]) == (1, "leave")
        await process.stop()
        said: list[str] = []
        while not said or "trying again in 2 s" not in said[-1]:  # past the client's 6.4 s
            said.append((await asyncio.wait_for(watch.stderr.readline(), 30)).decode())
            assert said[-1], "tidal watch exited while the server was away: " + "".join(said)
        assert said[0].startswith(f"tidal watch: lost 127.0.0.1:{port}"), said
        await process.start()
        while "resumed after" not in said[-1]:
            said.append((await asyncio.wait_for(watch.stderr.readline(), 30)).decode())
            assert said[-1], "tidal watch exited: " + "".join(said)
        async with await process.connect() as c:
            await c.rejoin(1)
        nxt = json.loads(await asyncio.wait_for(watch.stdout.readline(), 10))
        assert (nxt["id"], nxt["event"], nxt["user_id"]) == (2, "rejoin", 1)
        watch.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(watch.wait(), 10) == 0
    finally:
        if watch.returncode is None:
            watch.kill()
            await watch.wait()
        await process.stop()

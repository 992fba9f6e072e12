"""Consumer groups across what ends a server: kill -9, and a standby taking over on
PostgreSQL. What was acknowledged is never sent again; what was sent and not
acknowledged is, its count raised from the count on disk; dead letters, cursors and
receipts are as committed. And the tools: ``tidal groups``, ``tidal receipt``, ``tidal
watch --group``, and the blocking client's ``consume``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator

import pytest

from tidal.client import Client, SyncClient

from .conftest import Database, ServerProcess
from .group_peer import GroupPeer


@pytest.mark.both_backends
async def test_kill_9_loses_no_acknowledgement_and_sends_again_what_was_not(
    process: ServerProcess,
) -> None:
    await process.start()
    address = ("127.0.0.1", process.port)
    async with await process.connect() as c:
        await c.group_create("index", ack_wait=3600, max_deliveries=3)
        peer = await GroupPeer.join(address, "index")
        for user in range(10):
            await c.leave(user)
        await peer.until(10)
        error, acked = await peer.call("ack", [1, 2, 3, 5, 8])
        assert error is None and acked["cursor"] == 3, (error, acked)
        error, _ = await peer.call("nack", [9], {"dead": True, "reason": "poison"})
        assert error is None, error
        before = await c.receipt(1)
    await process.kill9()
    await process.start()
    address = ("127.0.0.1", process.port)
    async with await process.connect() as c:
        [index] = await c.groups()
        assert index["cursor"] == 3 and index["dead_letters"] == 1, index
        peer = await GroupPeer.join(address, "index")
        await peer.until(4)
        again = [(e["id"], n) for e, n in peer.got]
        assert again == [(4, 2), (6, 2), (7, 2), (10, 2)], again  # counted from disk
        assert await c.receipt(1) == before  # acknowledged, when: as committed
        [letter] = (await c.dead_letters("index"))["dead_letters"]
        assert (letter["id"], letter["reason"]) == (9, "poison")
        error, acked = await peer.call("ack", [4, 6, 7, 10])
        assert error is None and acked["cursor"] == 10, (error, acked)


@pytest.mark.parametrize("backend", ["postgresql"])
async def test_a_standby_that_takes_over_serves_the_groups_as_committed(
    database: Database,
) -> None:
    active = await ServerProcess(database.target).start()
    standby = await ServerProcess(database.target, "--standby").start(bound=True)
    await standby.logged("standby: waiting for")
    try:
        async with await active.connect() as c:
            await c.group_create("cache", ack_wait=3600)
            peer = await GroupPeer.join(("127.0.0.1", active.port), "cache")
            for user in range(4):
                await c.leave(user)
            await peer.until(4)
            error, _ = await peer.call("ack", [1, 2])
            assert error is None, error
        await active.kill9()
        await standby.logged("listening on")
        async with await standby.connect() as c:
            peer = await GroupPeer.join(("127.0.0.1", standby.port), "cache")
            await peer.until(2)
            assert [(e["id"], n) for e, n in peer.got] == [(3, 2), (4, 2)]
            states = [o["groups"]["cache"]["state"] for u in range(4)
                      for o in (await c.receipt(u))["optouts"]]  # fmt: skip
            assert states == ["acknowledged", "acknowledged", "pending", "pending"]
    finally:
        await standby.stop()


@contextlib.asynccontextmanager
async def watching(group: str, port: str) -> AsyncIterator[asyncio.StreamReader]:
    """``tidal watch --group GROUP`` against ``port``: what it prints, until the block ends."""
    watch = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tidal.cli", "watch", "--group", group, "--port", port,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert watch.stdout is not None
    try:
        yield watch.stdout
    finally:
        watch.terminate()
        await watch.wait()


def tidal(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "tidal.cli", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.both_backends
async def test_the_tools_list_groups_print_receipts_and_watch_a_group(
    process: ServerProcess,
) -> None:
    await process.start()
    port = str(process.port)
    async with await process.connect() as c:
        await c.group_create("search")
        await c.leave(42)
        async with watching("search", port) as printed:
            first = await asyncio.wait_for(printed.readline(), 30)
            assert first.decode().startswith("1 leave at="), first
            assert " user_id=42 " in first.decode(), first
            assert first.decode().rstrip().endswith("deliveries=1"), first

            async def acknowledged() -> bool:
                receipt = await c.receipt(42)
                return bool(receipt["optouts"][0]["groups"]["search"]["state"] == "acknowledged")

            for _ in range(1000):  # watch acknowledges each event once it printed it
                if await acknowledged():
                    break
                await asyncio.sleep(0.01)
            assert await acknowledged()
    done = await asyncio.to_thread(tidal, "groups", "--port", port)
    assert done.returncode == 0, done.stderr
    header, row = done.stdout.splitlines()
    assert header.split()[:2] == ["group", "cursor"] and row.split()[:2] == ["search", "1"]
    done = await asyncio.to_thread(tidal, "receipt", "42", "--port", port)
    assert done.returncode == 0, done.stderr
    assert "acknowledged" in done.stdout and "search" in done.stdout, done.stdout
    done = await asyncio.to_thread(tidal, "receipt", "42", "--json", "--port", port)
    receipt = json.loads(done.stdout)
    assert receipt["optouts"][0]["groups"]["search"]["state"] == "acknowledged"
    done = await asyncio.to_thread(tidal, "receipt", "7", "--port", port)
    assert "no leave, purge or erase" in done.stdout


@pytest.mark.both_backends
async def test_the_blocking_client_consumes_and_acknowledges(process: ServerProcess) -> None:
    await process.start()
    async with await process.connect() as c:
        await c.group_create("sync")
        await c.leave(1)
        await c.leave(2)

    def consume() -> list[tuple[int, int]]:
        got = []
        with SyncClient("127.0.0.1", process.port, timeout=10) as s, s.consume("sync") as ds:
            for d in ds:
                got.append((d.id, d.deliveries))
                d.ack()
                if len(got) == 2:
                    return got
        return got

    assert await asyncio.to_thread(consume) == [(1, 1), (2, 1)]
    async with await Client.connect("127.0.0.1", process.port, timeout=10) as c:
        [sync] = await c.groups()
        assert sync["cursor"] == 2 and sync["pending"] == 0

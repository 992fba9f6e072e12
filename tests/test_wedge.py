"""No request or setting may wedge storage: each value that once latched a backend, sent
again over a raw socket, gets a clear error or is stored, and the server goes on."""

from __future__ import annotations

import asyncio
import re
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tidal.client import Client, Signal
from tidal.protocol import ErrorCode
from tidal.protocol.limits import MIN_MESSAGE_SIZE
from tidal.server import Config, Server
from tidal.server.core.userrows import BLOCK

from .conftest import Database, ServerProcess
from .rawrpc import RawPeer
from .test_operations import refused, serve


async def pipelined(peer: RawPeer, *calls: tuple[str, list[Any]]) -> list[Any]:
    """Several requests in one write (so in one group commit); their replies by msgid."""
    for msgid, (method, params) in enumerate(calls, 1):
        peer.send([0, msgid, method, params])
    replies: dict[int, Any] = {}
    while len(replies) < len(calls):
        reply = await peer.receive()
        assert reply is not None, "the server closed the connection"
        replies[reply[1]] = reply
    return [replies[i] for i in range(1, len(calls) + 1)]


async def healthy(server: Server) -> None:
    async with await Client.connect(*server.address, timeout=10) as c:
        assert (await c.health())["status"] == "ok"
        assert (await c.signal(1, "after", "view")).seq >= 1  # and it still takes writes


@pytest.mark.both_backends
@pytest.mark.parametrize(
    ("params", "argument"),
    [
        ([7, "a\x00b", "view"], "entity"),
        ([7, "e", "vi\x00ew"], "kind"),
        ([7, "e", "view", 1.0, {"communities": ["jazz\x00"]}], "communities[0]"),
        ([7, "e", "view", 1.0, {"attrs": {"co\x00untry": "DE"}}], "attrs key"),
        ([7, "e", "view", 1.0, {"attrs": {"country": "D\x00E"}}], "attrs['country']"),
        ([7, "e", "view", 1.0, {"id": "order\x001"}], "id"),
    ],
)
async def test_a_nul_anywhere_in_a_signal_is_refused_and_storage_goes_on(
    server: Server, params: list[Any], argument: str
) -> None:
    peer = await RawPeer.open(server.address)
    try:
        ok, bad, batch = await pipelined(
            peer,
            ("signal", [8, "e", "view"]),
            ("signal", params),
            ("signal_batch", [[[8, "e", "view"], params]]),
        )
        assert ok[2] is None and ok[3]["seq"] >= 1  # a write beside it, in its commit
        for reply in (bad, batch):
            assert reply[2][0] == ErrorCode.INVALID_PARAMS, reply
            assert argument in reply[2][1] and "NUL" in reply[2][1], reply
    finally:
        peer.close()
    await healthy(server)


@pytest.mark.both_backends
async def test_a_key_used_twice_in_one_group_commit_is_stored_once(database: Database) -> None:
    """An erase forgets the user's keys, so the same key again is a new signal, and both
    are upserted in one commit: the last one wins, as it does in memory."""
    srv = Server(Config(host="127.0.0.1", port=0, db=database.target))
    await srv.start()
    try:
        peer = await RawPeer.open(srv.address)
        context = {"id": "order-1"}
        first, erased, again = await pipelined(
            peer,
            ("signal", [7, "e", "view", 1.0, context]),
            ("erase", [7]),
            ("signal", [7, "e", "view", 1.0, context]),
        )
        peer.close()
        assert first[2] is None and erased[2] is None and again[2] is None, (first, again)
        assert again[3]["seq"] > first[3]["seq"]
        await healthy(srv)
    finally:
        await srv.shutdown()
    rows = await database.rows("SELECT key, seq FROM signal_keys")
    assert rows == [("order-1", again[3]["seq"])]


@pytest.mark.both_backends
@pytest.mark.parametrize(
    ("settings", "keys"),
    [
        ({"idempotency_window": 0}, ["k1", "k1"]),
        ({"idempotency_max_keys": 2}, ["k1", "k2", "k3", "k1"]),
    ],
)
async def test_keys_past_the_window_or_the_cap_reused_in_one_commit(
    database: Database, settings: dict[str, Any], keys: list[str]
) -> None:
    srv = Server(Config(host="127.0.0.1", port=0, db=database.target, **settings))
    await srv.start()
    try:
        peer = await RawPeer.open(srv.address)
        replies = await pipelined(peer, *[("signal", [7, "e", "v", 1.0, {"id": k}]) for k in keys])
        peer.close()
        assert all(r[2] is None for r in replies), replies
        await healthy(srv)
    finally:
        await srv.shutdown()


async def test_a_counts_cursor_of_the_wrong_type_is_invalid_params(server: Server) -> None:
    peer = await RawPeer.open(server.address)
    try:
        for after in ([1.0, 1, "v"], [True, 1, "v"], [0, 1.5, "v"]):
            reply = await peer.call("counts", "e", {"after": after})
            assert reply[2][0] == ErrorCode.INVALID_PARAMS, reply
            assert "page.after" in reply[2][1]
    finally:
        peer.close()


def test_a_message_size_that_leaves_no_room_for_a_reply_is_refused_at_start(
    tmp_path: Path,
) -> None:
    for size in (1024, MIN_MESSAGE_SIZE - 1):
        line = refused(serve(tmp_path / "t.db", "--max-message-size", str(size)), "must be")
        assert f"{MIN_MESSAGE_SIZE} to " in line and "--max-message-size" in line


async def test_at_the_smallest_message_size_every_read_pages_and_the_writer_lives(
    tmp_path: Path,
) -> None:
    db = str(tmp_path / "t.db")
    srv = Server(Config(host="127.0.0.1", port=0, db=db, max_message_size=MIN_MESSAGE_SIZE))
    await srv.start()
    try:
        async with await Client.connect(*srv.address, timeout=10) as c:
            # a predicate near its bound (64 KiB): the largest single item a reply carries
            big = {f"a{i:02}": [f"{i:02}{j:02}-{'v' * 50}" for j in range(16)] for i in range(64)}
            await c.define_cohort("big", big)
            for user in range(300):
                await c.leave(user)
                await c.signal(1000 + user, "e", "view", communities=[f"c{user}"])
            assert len(await c.history(5)) == 1
            listed = await c.call("left_users", None)
            assert len(listed["users"]) == 300
            page = await c.call("counts", "e")
            assert page["ledger"] and "more" in page
            cohorts = await c.call("cohorts", {"limit": 10})
            assert "big" in cohorts["cohorts"]
            assert (await c.health())["status"] == "ok"
            assert (await c.signal(1, "after", "view")).seq > 300
    finally:
        await srv.shutdown()


# -- work per commit is bounded ------------------------------------------------------


@pytest.mark.both_backends
async def test_pipelined_purges_do_not_stall_other_clients(server: Server) -> None:
    """1,500 purges in one write (20 KB): each commit takes a bounded share, and the signals
    of another client wait one commit, not all of them."""
    async with await Client.connect(*server.address, timeout=30) as other:
        for i in range(50):  # a ledger to search
            await other.signal(i, "e", "view")
        peer = await RawPeer.open(server.address)
        purges = [("purge", [100_000 + i]) for i in range(1500)]
        waits: list[float] = []

        async def signals() -> None:
            while len(waits) < 40:
                began = time.perf_counter()
                await other.signal(1, "e", "view")
                waits.append(time.perf_counter() - began)

        replies, _ = await asyncio.gather(pipelined(peer, *purges), signals())
        peer.close()
    assert all(r[2] is None and r[3]["purged"] == 0 for r in replies)
    assert max(waits) < 1.0, f"another client's signal waited {max(waits):.2f} s"


async def test_after_retention_has_emptied_the_ledger_boot_lists_no_block(
    tmp_path: Path,
) -> None:
    """Boot lists users from the oldest kept row on, not from seq 1: a ledger retention has
    emptied costs nothing to boot, however many seqs it once gave."""
    offset = [0]

    def clock() -> int:
        return time.time_ns() + offset[0]

    def config() -> Config:
        # a retention pass each second, a checkpoint at every commit
        db = str(tmp_path / "t.db")
        return Config(
            host="127.0.0.1", port=0, db=db, ledger_retention=10.0, checkpoint_seconds=0.1
        )

    srv = Server(config(), clock=clock)
    await srv.start()
    try:
        async with await Client.connect(*srv.address, timeout=10) as c:
            for start in range(0, 3 * BLOCK, 1024):
                await c.signal_batch([Signal(u, "e", "view") for u in range(start, start + 1024)])
            offset[0] = 60 * 10**9  # a minute on: every row is past the retention
            await c.signal(1, "e", "view")
        retention = srv.engine.retention
        while srv.engine.ledger_rows > 1:
            retention.caught_up.clear()
            await asyncio.wait_for(retention.caught_up.wait(), 30)
    finally:
        await srv.shutdown()
    with sqlite3.connect(tmp_path / "t.db") as db:
        assert db.execute("SELECT COUNT(*) FROM ledger").fetchone() == (1,)
        assert db.execute("SELECT COUNT(*) FROM ledger_users").fetchone() == (0,)
    srv = Server(config(), clock=clock)
    began = time.perf_counter()
    await srv.start()
    booted = time.perf_counter() - began
    try:
        with sqlite3.connect(tmp_path / "t.db") as db:
            blocks = db.execute("SELECT first_seq FROM ledger_users").fetchall()
        assert blocks == [], f"boot listed {len(blocks)} blocks of rows retention had deleted"
        assert srv.engine.user_rows.next_block > 2 * BLOCK
        async with await Client.connect(*srv.address, timeout=10) as c:
            assert (await c.purge(1)).signals == 1  # the kept row is still found
    finally:
        await srv.shutdown()
    assert booted < 5, booted


# -- one database, one tidal, whatever its paths -------------------------------------


async def test_a_hard_link_a_bind_mount_and_another_path_find_the_same_lock(
    tmp_path: Path,
) -> None:
    first_dir = tmp_path / "a"
    first_dir.mkdir()
    process = await ServerProcess(first_dir / "t.db").start()
    try:
        assert process.proc is not None
        linked = tmp_path / "b"
        linked.mkdir()
        (linked / "other.db").hardlink_to(first_dir / "t.db")
        mounted = tmp_path / "c"
        mounted.mkdir()
        bind = ["mount", "--bind", str(first_dir), str(mounted)]
        if (await asyncio.to_thread(subprocess.run, bind, check=False)).returncode != 0:
            pytest.fail("this test bind-mounts a directory and needs root to")
        try:
            names = [linked / "other.db", mounted / "t.db", tmp_path / "b" / ".." / "a" / "t.db"]
            for name in names:
                done = await asyncio.to_thread(serve, name)
                refused(done, f"pid {process.proc.pid}", "another tidal")
        finally:
            await asyncio.to_thread(subprocess.run, ["umount", str(mounted)], check=False)
        async with await process.connect() as c:
            assert (await c.signal(1, "e", "view")).seq == 1
    finally:
        assert await process.stop() == 0


# -- the log stays readable --------------------------------------------------------------


def test_a_repeated_error_is_logged_once_per_interval_with_a_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import logging

    from tidal.server.logs import Throttle

    say = Throttle(logging.getLogger("tidal.test"), interval=3600)
    with caplog.at_level(logging.ERROR, "tidal.test"):
        for i in range(1000):
            say("refused", logging.ERROR, "batch %d refused", i)
        say("other", logging.ERROR, "another cause")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["batch 0 refused", "another cause"]
    say._next["refused"] = 0.0  # the interval has passed
    with caplog.at_level(logging.ERROR, "tidal.test"):
        say("refused", logging.ERROR, "batch %d refused", 1000)
    assert re.search(r"batch 1000 refused \(and 999 more like it", caplog.records[-1].getMessage())

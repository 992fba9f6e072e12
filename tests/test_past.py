"""A leaver's past: purge, erase, history, left_users and ledger retention, over real sockets
and real files."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from array import array
from pathlib import Path
from typing import Any

import msgpack
import pytest

from tidal.client import Client, Counts, Event, Signal, SignalAck, Tally, Unavailable
from tidal.server import Config, Server
from tidal.server.core import userrows
from tidal.server.core.ledger import COMMUNITY
from tidal.server.engine import retention
from tidal.server.errors import StorageFailure
from tidal.server.storage.sqlite.sqlite_schema import MIGRATIONS

from .conftest import Database, ServerProcess
from .rawrpc import RawPeer
from .test_durability import fail_once

pytestmark = pytest.mark.both_backends
GOLD = {"tier": "gold"}


async def seed(c: Client) -> None:
    """Users 1 and 2 each reach the cohort, community x and (user 2) community y."""
    await c.define_cohort("gold", GOLD)
    for _ in range(3):
        await c.signal(1, "song", "view", 2.0, communities=["x"], attrs=GOLD)
        await c.signal(2, "song", "view", 1.0, communities=["x", "y"], attrs=GOLD)


def only_user_2(counts: Counts, ledger: Tally) -> None:
    assert counts.ledger == {"view": ledger}
    assert counts.cohorts == {"gold": {"view": Tally(3, 3.0)}}
    assert counts.communities == {"x": {"view": Tally(3, 3.0)}, "y": {"view": Tally(3, 3.0)}}


@pytest.mark.through_cluster
async def test_purge_withdraws_one_user_s_past_and_nobody_else_s(client: Client) -> None:
    await seed(client)
    purged = await client.purge(1)
    assert (purged.user_id, purged.signals) == (1, 3)
    only_user_2(await client.counts("song"), Tally(6, 9.0))  # the ledger layer still counts user 1
    assert (await client.status(1)).status == "active"  # purge does not leave
    assert (await client.purge(1)).signals == 0  # nothing is withdrawn twice
    again = await client.signal(1, "song", "view", 2.0, communities=["x"], attrs=GOLD)
    assert again.forwarded  # an Active user's next signal is counted as usual
    counts = await client.counts("song")
    assert counts.communities["x"] == {"view": Tally(4, 5.0)}
    assert counts.cohorts["gold"] == {"view": Tally(4, 5.0)}


async def test_purge_reaches_rows_in_the_table_and_in_memory_and_survives_restart(
    database: Database,
) -> None:
    """With a checkpoint every 2 signals, the user's rows lie on both sides of the
    aggregates' watermark: some in the table, some only in memory."""
    config = Config(port=0, db=database.target, checkpoint_signals=2)
    server = Server(config)
    await server.start()
    async with await Client.connect(*server.address) as c:
        await seed(c)
        await c.signal(1, "song", "view", 2.0, communities=["x"], attrs=GOLD)  # above it
        assert (await c.purge(1)).signals == 4
        only_user_2(await c.counts("song"), Tally(7, 11.0))
    await server.shutdown()
    server = Server(config)
    await server.start()
    async with await Client.connect(*server.address) as c:
        only_user_2(await c.counts("song"), Tally(7, 11.0))
        assert [e.event for e in await c.history(1)] == ["purge"]
    await server.shutdown()


@pytest.mark.through_cluster
async def test_leave_with_purge_answers_both_and_history_records_both(client: Client) -> None:
    await seed(client)
    left = await client.leave(2, purge=True)
    assert (left.status, left.purged) == ("left", 3)
    counts = await client.counts("song")
    assert counts.communities == {"x": {"view": Tally(3, 6.0)}}
    assert counts.cohorts == {"gold": {"view": Tally(3, 6.0)}}
    assert (await client.leave(3)).purged is None  # a plain leave purges nothing
    history = await client.history(2)
    assert [(e.event, e.signals) for e in history] == [("leave", None), ("purge", 3)]
    assert left.left_at_ns is not None
    assert history[0].at_ns == left.left_at_ns < history[1].at_ns


async def test_leave_with_purge_is_one_step_for_every_reader(database: Database) -> None:
    """Pipelined [status, counts, status] from another connection, around a pipelined
    [signal, leave+purge, counts]: no counts sees the user Left with their past counted,
    or their past gone while Active. (A checkpoint every 2 signals puts the past in the
    table as well as in memory.)"""
    server = Server(Config(port=0, db=database.target, checkpoint_signals=2))
    await server.start()
    try:
        await one_step_for_every_reader(server)
    finally:
        await server.shutdown()


async def one_step_for_every_reader(server: Server) -> None:
    async with await Client.connect(*server.address) as c:
        await seed(c)
    writer, reader = await RawPeer.open(server.address), await RawPeer.open(server.address)
    triples = 300
    for i in range(triples // 2):
        reader.send([0, 3 * i, "status", [1]])
        reader.send([0, 3 * i + 1, "counts", ["song"]])
        reader.send([0, 3 * i + 2, "status", [1]])
    writer.send([0, 1, "signal", [1, "song", "view", 2.0, {"communities": ["x"]}]])
    writer.send([0, 2, "leave", [1, {"purge": True}]])
    writer.send([0, 3, "counts", ["song"]])
    for i in range(triples // 2, triples):
        reader.send([0, 3 * i, "status", [1]])
        reader.send([0, 3 * i + 1, "counts", ["song"]])
        reader.send([0, 3 * i + 2, "status", [1]])
    mine = {r[1]: r[3] for r in [await writer.receive() for _ in range(3)]}
    assert mine[2]["purged"] == 4  # the signal read just before the leave went too
    assert mine[3]["communities"]["x"]["view"]["count"] == 3  # user 2's alone
    replies = {r[1]: r[3] for r in [await reader.receive() for _ in range(3 * triples)]}
    seen = set()
    for i in range(triples):
        before, counts, after = (replies[3 * i + k] for k in range(3))
        x = counts["communities"]["x"]["view"]["count"]
        if before["status"] == "left":
            assert x == 3, (i, x)
            seen.add("left")
        if after["status"] == "active":
            assert x in (6, 7), (i, x)  # with or without the signal read before the leave
            seen.add("active")
    assert seen, "no read was judged"
    writer.close()
    reader.close()


async def test_erase_deletes_the_rows_and_every_trace_but_the_event(database: Database) -> None:
    server = Server(Config(port=0, db=database.target, checkpoint_signals=2))
    await server.start()
    try:
        async with await Client.connect(*server.address) as c:
            await seed(c)
            await c.signal(1, "song", "like", 1.0, key="k-1")
            erased = await c.erase(1)
            assert (erased.user_id, erased.signals) == (1, 4)
            only_user_2(await c.counts("song"), Tally(3, 3.0))
            status = await c.status(1)
            assert status.status == "left" and status.left_at_ns is not None
            assert status.left_at_ns < erased.at_ns  # left as it was read; erased as it took effect
            # a stale client's later signal is gated, and its key was forgotten: a new row
            late = await c.signal(1, "song", "like", 1.0, key="k-1")
            assert not late.forwarded
            history = await c.history(1)
            assert [(e.event, e.signals) for e in history] == [("erase", 4)]
            assert (await c.erase(404)).signals == 0  # unknown: nothing, but recorded
            assert [e.event for e in await c.history(404)] == ["erase"]
            assert await c.history(405) == []
            assert (await c.stats())["ledger_rows"] == 4  # user 2's three, and the late one
    finally:
        await server.shutdown()
    rows = await database.rows("SELECT user_id, forwarded, kind FROM ledger WHERE user_id = 1")
    assert rows == [(1, 0, "like")]  # only the gated one after the erase
    keys = await database.rows("SELECT seq FROM signal_keys WHERE key = 'k-1'")
    assert keys == [(late.seq,)]
    events = await database.rows("SELECT event, signals FROM history WHERE user_id = 1")
    assert events == [(4, 4)]


async def test_a_withdrawal_whose_rows_cannot_be_read_says_what_was_saved(
    server: Server,
) -> None:
    """The survey of a leave with purge, or of an erase, fails (a read refused, as when
    PostgreSQL restarts) after the leave it made was committed: the error says the user
    is Left, the feed and history say so too, and nothing else of it happened: the
    erase's keys still answer, counted once."""
    storage = server._storage
    assert storage is not None
    real = storage.read
    failing = asyncio.Event()

    async def read(plan: Any) -> Any:
        if failing.is_set():
            failing.clear()
            raise StorageFailure("read failed: injected", transient=True)
        return await real(plan)

    storage.read = read  # type: ignore[method-assign]
    async with await Client.connect(*server.address) as c:
        await seed(c)
        kept = await c.signal(3, "song", "view", key="k-3")
        failing.set()
        with pytest.raises(Unavailable) as refused:
            await c.leave(1, purge=True)
        assert "the leave is saved (the user is Left); the rest" in refused.value.message
        failing.set()
        with pytest.raises(Unavailable) as refused:
            await c.erase(3)
        assert "the user is Left, as the erase was read; the rest" in refused.value.message
        assert (await c.status(1)).left and (await c.status(3)).left
        assert [e.event for e in await c.history(1)] == ["leave"]
        assert await c.history(3) == []
        assert (await c.counts("song")).communities["x"] == {"view": Tally(6, 9.0)}
        again = await c.signal(3, "song", "view", key="k-3")  # not erased: the same row
        assert again == kept
        assert (await c.purge(1)).signals == 3  # asked again: it happens now
        events = []
        async with c.subscribe(from_id=0) as feed:
            async for event in feed:
                events.append((event.event, event.user_id, event.purged))
                if event.event == "purge":
                    break
    assert events == [("define_cohort", None, None), ("leave", 1, None), ("purge", 1, 3)]


async def test_a_leave_with_purge_whose_purge_s_commit_fails_says_the_leave_is_saved(
    server: Server,
) -> None:
    """The leave is committed; the purge joins a later batch, which the database refuses:
    the error says the user is Left and the rest is to ask again, not that nothing was
    saved (the fault-history checker found a leave in the database whose request was
    answered so, after PostgreSQL was restarted)."""
    storage = server._storage
    assert storage is not None
    real_read, real_commit = storage.read, storage.commit
    leave_committed = asyncio.Event()

    async def commit(transaction: Any) -> None:
        batch = transaction.batch
        if batch.past:
            raise StorageFailure("commit failed: injected", transient=True)
        await real_commit(transaction)
        if batch.memberships:
            leave_committed.set()

    async def read(plan: Any) -> Any:
        await leave_committed.wait()  # the survey: the purge joins a batch after the leave's
        return await real_read(plan)

    async with await Client.connect(*server.address) as c:
        await seed(c)
        storage.commit = commit  # type: ignore[method-assign]
        storage.read = read  # type: ignore[method-assign]
        # the signal, read after the leave, wakes the writer: the leave's batch commits
        # (alone, the leave would wait for its purge to join the same batch)
        refused, woke = await asyncio.gather(
            c.leave(1, purge=True), c.signal(9, "other", "view"), return_exceptions=True
        )
        storage.commit, storage.read = real_commit, real_read  # type: ignore[method-assign]
        assert isinstance(woke, SignalAck) and isinstance(refused, Unavailable), (woke, refused)
        message = refused.message
        assert "commit failed: injected; the leave is saved (the user is Left)" in message
        assert "the rest of this request was not saved: ask again" in message
        assert (await c.status(1)).left
        assert [e.event for e in await c.history(1)] == ["leave"]
        assert (await c.counts("song")).communities["x"] == {"view": Tally(6, 9.0)}
        assert (await c.purge(1)).signals == 3  # asked again: it happens now


async def test_a_read_behind_a_leave_with_purge_whose_rows_cannot_be_read_is_answered(
    server: Server,
) -> None:
    """Pipelined: a leave with purge, ``counts``, a signal. The purge's survey fails while
    the leave's batch is still committing: the leave's reply goes out with that batch,
    saying the leave is saved, and the read and the signal behind it are answered then.
    (The fault-history checker found them never answered, on PostgreSQL restarts: the
    connection applied nothing more until its client gave up.)"""
    storage = server._storage
    assert storage is not None
    real_read, real_commit = storage.read, storage.commit
    read_failed = asyncio.Event()

    async def commit(transaction: Any) -> None:
        if transaction.batch.memberships:  # the leave's batch: open while its survey fails
            await read_failed.wait()
        await real_commit(transaction)

    async def read(plan: Any) -> Any:
        read_failed.set()
        raise StorageFailure("read failed: injected", transient=True)

    async with await Client.connect(*server.address) as c:
        await seed(c)
    storage.commit, storage.read = commit, read  # type: ignore[method-assign]
    peer = await RawPeer.open(server.address)
    sent = [
        [0, 1, "leave", [1, {"purge": True}]],
        [0, 2, "counts", ["song"]],
        [0, 3, "signal", [1, "song", "view"]],
    ]
    peer.send_raw(b"".join(msgpack.packb(m) for m in sent))  # read in one go
    replies = {r[1]: r for r in [await peer.receive(timeout=10) for _ in sent]}
    storage.commit, storage.read = real_commit, real_read  # type: ignore[method-assign]
    assert replies[1][2][0] == 2 and "the leave is saved (the user is Left)" in replies[1][2][1]
    assert replies[2][3]["ledger"] == {"view": {"count": 6, "weight": 9.0}}, replies[2]
    assert replies[2][3]["communities"]["x"] == {"view": {"count": 6, "weight": 9.0}}
    assert replies[3][3]["forwarded"] is False  # Left: the leave is saved
    peer.close()


async def test_a_read_after_a_purge_answers_as_of_its_place_on_its_connection(
    server: Server,
) -> None:
    """Pipelined on one connection: four signals, a leave with purge, ``counts``, one more
    signal. The read waits for the purge, and shows the four, not the one sent after it
    (issue 39, item 5: it showed five, "my read saw the future")."""
    peer = await RawPeer.open(server.address)
    sent = [[0, i, "signal", [3, "e1", "view", 1.0, {"communities": ["x"]}]] for i in range(4)]
    sent += [
        [0, 4, "leave", [3, {"purge": True}]],
        [0, 5, "counts", ["e1"]],
        [0, 6, "signal", [3, "e1", "view"]],
        [0, 7, "counts", ["e1"]],
    ]
    peer.send_raw(b"".join(msgpack.packb(m) for m in sent))  # read in one go
    replies = {r[1]: r for r in [await peer.receive() for _ in sent]}
    assert all(r[2] is None for r in replies.values()), replies
    assert replies[4][3]["purged"] == 4
    first, last = replies[5][3], replies[7][3]
    assert first["ledger"] == {"view": {"count": 4, "weight": 4.0}}, first
    assert first["communities"] == {}  # withdrawn by the purge
    assert last["ledger"] == {"view": {"count": 5, "weight": 5.0}}, last
    peer.close()


async def test_the_past_survives_kill_9(process: ServerProcess) -> None:
    await process.start()
    async with await process.connect() as c:
        await seed(c)
        await c.leave(1, purge=True)
        erased = await c.erase(2)
        await c.rejoin(1)
    await process.kill9()
    await process.start()
    async with await process.connect() as c:
        counts = await c.counts("song")
        assert counts.ledger == {"view": Tally(3, 6.0)}  # user 1's rows only, unforwarded
        assert counts.cohorts == {} and counts.communities == {}
        assert [e.event for e in await c.history(1)] == ["leave", "purge", "rejoin"]
        assert [(e.event, e.signals) for e in await c.history(2)] == [("erase", 3)]
        page = await c.left_users()
        assert page.next is None and [user for user, _ in page.users] == [2]
        assert page.users[0][1] < erased.at_ns  # left as the erase was read
        assert (await c.stats())["ledger_rows"] == 3  # counted at boot without a scan
        # the newest row (seq 6) was erased: its seq is still never given again
        assert (await c.signal(5, "song", "view")).seq == 7


async def test_a_refused_commit_undoes_an_erase(server: Server) -> None:
    async with await Client.connect(*server.address) as c:
        await seed(c)
        await c.signal(1, "song", "like", key="kept")
        fail_once(server, lambda batch: bool(batch.past))
        counts_before = await c.counts("song")
        with pytest.raises(Unavailable, match="disk is full"):
            await c.erase(1)
        assert (await c.status(1)).status == "active"
        assert await c.counts("song") == counts_before
        retry = await c.signal(1, "song", "like", key="kept")  # the key is still known
        assert retry.seq == 7
        assert await c.history(1) == []
        assert (await c.erase(1)).signals == 4  # and it works once the disk does


@pytest.mark.through_cluster
async def test_history_pages_by_time_and_left_users_by_id(client: Client) -> None:
    for _ in range(3):
        await client.leave(9)
        await client.rejoin(9)
    lines = await client.history(9)
    assert [e.event for e in lines] == ["leave", "rejoin"] * 3
    assert [e.at_ns for e in lines] == sorted({e.at_ns for e in lines})  # strictly increasing
    first = await client.history(9, limit=4)
    rest = await client.history(9, 100, first[-1].at_ns)
    assert first + rest == lines
    users = [5, 2**63 - 1, 2**63, 2**64 - 1, 0, 7]
    for user in users:
        await client.leave(user)
    await client.rejoin(7)
    seen: list[int] = []
    after = None
    while True:
        page = await client.left_users(after, 2)
        seen += [u for u, _ in page.users]
        if page.next is None:
            break
        after = page.next
    assert seen == sorted(u for u in users if u != 7)  # unsigned order, as on the wire


async def test_left_users_and_history_see_the_writes_read_before_them(server: Server) -> None:
    """Pipelined: each read shows what was read before it, though none of it had committed."""
    peer = await RawPeer.open(server.address)
    peer.send([0, 1, "leave", [11]])
    peer.send([0, 2, "left_users", []])
    peer.send([0, 3, "purge", [11]])
    peer.send([0, 4, "history", [11]])
    peer.send([0, 5, "rejoin", [11]])
    peer.send([0, 6, "left_users", []])
    replies = {r[1]: r for r in [await peer.receive() for _ in range(6)]}
    assert [u for u, _ in replies[2][3]["users"]] == [11]
    # a history read waits for the purge read before it to take effect, a commit later, and
    # the rejoin sent after it waits with it: the read answers as of its place (issue 39,
    # item 5: it showed the rejoin)
    lines = [(e["event"], e["signals"]) for e in replies[4][3]]
    assert lines == [("leave", None), ("purge", 0)]
    assert replies[6][3]["users"] == []
    peer.close()


async def test_count_left_counts_as_of_its_place_in_its_connection(server: Server) -> None:
    """Pipelined: each count shows the leaves and rejoins read before it, none after,
    though it is counted by the database beside the writer."""
    peer = await RawPeer.open(server.address)
    sent: list[list[Any]] = []
    for user in range(1, 6):
        sent += [["leave", [user]], ["count_left", []]]
    sent += [["leave", [3]], ["count_left", []], ["rejoin", [2]], ["count_left", []]]
    sent += [["erase", [9]], ["count_left", []], ["rejoin", [7]], ["count_left", []]]
    for msgid, (method, params) in enumerate(sent):
        peer.send([0, msgid, method, params])
    replies = {r[1]: r for r in [await peer.receive() for _ in sent]}
    counts = [replies[i][3] for i, (method, _) in enumerate(sent) if method == "count_left"]
    # a second leave of user 3 and a rejoin of user 7 (never Left) change nothing; an
    # erase makes an Active user Left
    assert counts == [1, 2, 3, 4, 5, 5, 4, 5, 5]
    peer.close()
    async with await Client.connect(*server.address) as c:
        assert await c.count_left() == 5
        assert await c.count_left() == len((await c.left_users()).users)


async def ledger_rows(db: Database) -> list[Any]:
    return await db.rows("SELECT user_id FROM ledger ORDER BY seq")


async def test_retention_deletes_old_rows_and_leaves_counts_alone(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retention, "RETIRE_ROWS", 2)  # chunk after chunk, until caught up
    now = [1_700_000_000 * 10**9]
    day = 86_400 * 10**9
    config = Config(port=0, db=database.target, checkpoint_signals=2)
    server = Server(config, clock=lambda: now[0])
    await server.start()
    async with await Client.connect(*server.address) as c:
        await seed(c)
        now[0] += 2 * day
        await c.signal(3, "song", "view", 5.0, communities=["x"])
        before = await c.counts("song")
    await server.shutdown()
    server = Server(
        Config(port=0, db=database.target, ledger_retention=86_400), clock=lambda: now[0]
    )
    await server.start()
    try:
        await asyncio.wait_for(server.engine.retention.caught_up.wait(), 10)
        assert await ledger_rows(database) == [(3,)]  # the six of two days ago are gone
        async with await Client.connect(*server.address) as c:
            assert await c.counts("song") == before
            stats = await c.stats()
            assert (stats["ledger_rows"], stats["ledger_retired"]) == (1, 6)
            assert stats["db_bytes"] > 0
            # the past is out of reach: a purge finds nothing to withdraw
            assert (await c.purge(1)).signals == 0
            assert await c.counts("song") == before
    finally:
        await server.shutdown()


async def test_a_cohort_of_everyone_is_replayed_and_withdrawn(process: ServerProcess) -> None:
    """A signal without attributes still reaches a cohort with an empty predicate; its row
    must say so, or a replay after kill -9 (and an erase) would miss that cohort."""
    await process.start()
    async with await process.connect() as c:
        await c.define_cohort("everyone", {})
        await c.signal(1, "song", "view")
        await c.signal(2, "song", "view")
    await process.kill9()
    await process.start()
    async with await process.connect() as c:
        assert (await c.counts("song")).cohorts == {"everyone": {"view": Tally(2, 2.0)}}
        assert (await c.erase(1)).signals == 1
        assert (await c.counts("song")).cohorts == {"everyone": {"view": Tally(1, 1.0)}}


async def recompute(db: Database, entity: str) -> dict[str, Any]:
    """An entity's counts recomputed from the ledger as it stands in the database: the
    ledger layer from every row, cohorts (as defined now) and communities from forwarded
    rows."""
    names = dict(await db.rows("SELECT id, name FROM cohorts"))
    rows = await db.rows(
        "SELECT kind, weight, forwarded, context FROM ledger_counted WHERE entity = ?", entity
    )
    out: dict[str, Any] = {"ledger": {}, "cohorts": {}, "communities": {}}

    def bump(into: dict[str, Any], kind: str, weight: float) -> None:
        tally = into.setdefault(kind, Tally(0, 0.0))
        into[kind] = Tally(tally.count + 1, tally.weight + weight)

    for kind, weight, forwarded, context in rows:
        bump(out["ledger"], kind, weight)
        if forwarded and context is not None:
            communities, _, cohorts = msgpack.unpackb(context)
            for cid in cohorts:
                if cid in names:
                    bump(out["cohorts"].setdefault(names[cid], {}), kind, weight)
            for name in communities:
                bump(out["communities"].setdefault(name, {}), kind, weight)
    return out


def as_dict(counts: Counts) -> dict[str, Any]:
    return {"ledger": counts.ledger, "cohorts": counts.cohorts, "communities": counts.communities}


async def test_purge_and_erase_find_rows_across_blocks_and_restarts(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks of 4 rows, so that a user's rows are spread over many blocks of ledger_users
    and memory; checked against the file itself."""
    monkeypatch.setattr(userrows, "BLOCK", 4)
    config = Config(port=0, db=database.target, checkpoint_signals=5)
    expected_purged = dict.fromkeys(range(6), 0)
    for round_ in range(3):
        server = Server(config)
        await server.start()
        async with await Client.connect(*server.address) as c:
            if round_ == 0:
                await c.define_cohort("gold", GOLD)
            for i in range(40):
                user = i % 6
                await c.signal(user, "song", "view", float(i % 4), communities=[f"c{i % 3}"],
                               attrs=GOLD if i % 2 else {})  # fmt: skip
                expected_purged[user] += 1
            for user in (1, 4):
                assert (await c.purge(user)).signals == expected_purged[user]
                expected_purged[user] = 0
            assert as_dict(await c.counts("song")) == await recompute(database, "song")
        await server.shutdown()
    server = Server(config)
    await server.start()
    async with await Client.connect(*server.address) as c:
        assert (await c.erase(2)).signals == 3 * 7  # i % 6 == 2 for 7 of 40, each round
        assert (await c.purge(3)).signals == expected_purged[3]
        assert as_dict(await c.counts("song")) == await recompute(database, "song")
        assert (await c.erase(2)).signals == 0
    await server.shutdown()
    blocks = await database.rows("SELECT first_seq, users FROM ledger_users")
    assert len(blocks) >= 25
    listed = [user for _, block in blocks for user in array("q", block)]
    assert 2 not in listed and 3 in listed  # an erased user leaves no trace of their rows


async def test_a_version_2_database_gets_its_past_findable(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upgrade: the rows already there are listed by user at boot, leaves become history."""
    monkeypatch.setattr(userrows, "BLOCK", 4)
    with sqlite3.connect(db_path) as db:
        for statement in MIGRATIONS[0] + MIGRATIONS[1]:
            db.execute(statement)
        db.execute("PRAGMA user_version = 2")
        context = msgpack.packb([["x"], {}, []])
        db.executemany(
            "INSERT INTO ledger VALUES (?, ?, 'song', 'view', 1.0, 0, 1, ?)",
            [(seq, seq % 3, context) for seq in range(1, 11)],
        )
        db.execute("INSERT INTO memberships VALUES (7, 1, 1234)")
    server = Server(Config(port=0, db=str(db_path)))
    await server.start()
    try:
        async with await Client.connect(*server.address) as c:
            assert (await c.counts("song")).communities == {"x": {"view": Tally(10, 10.0)}}
            assert (await c.purge(1)).signals == 4  # seqs 1, 4, 7 and 10
            file = Database("sqlite", str(db_path))
            assert as_dict(await c.counts("song")) == await recompute(file, "song")
            assert await c.history(7) == [Event("leave", 1234, None)]
    finally:
        await server.shutdown()


def folded(db: Path) -> bytes:
    """The database file's bytes, once its write-ahead log has been folded in."""
    wal = Path(str(db) + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0
    return db.read_bytes()


async def test_an_erased_user_s_data_is_not_left_in_the_file(db_path: Path) -> None:
    """Deleted rows stay readable in SQLite's free space unless overwritten: look for the
    bytes themselves once the server has stopped (and its write-ahead log is folded in)."""
    server = Server(Config(port=0, db=str(db_path)))
    await server.start()
    async with await Client.connect(*server.address) as c:
        signals = [
            Signal(5, "song", "view", attrs={"note": "needle-5f3a"}, key=f"key-5f3a-{i}")
            if i % 10 == 0
            else Signal(6, "song", "view", attrs={"note": "other-77c1"})
            for i in range(300)
        ]  # sparse: the pages they were on stay full enough to be kept, not rebuilt
        await c.signal_batch(signals)
        assert (await c.erase(5)).signals == 30
    await server.shutdown()
    data = await asyncio.to_thread(folded, db_path)
    assert b"other-77c1" in data  # what was not erased is there, as it should be
    assert b"needle-5f3a" not in data and b"key-5f3a" not in data


async def test_a_purge_and_an_erase_between_checkpoints_survive_kill_9(
    database: Database,
) -> None:
    """A purge or erase leaves the tables as the last checkpoint wrote them and records
    what it took off (``withdrawals``): after kill -9, boot takes it off again, so every
    count, window and ranking shows only the user kept; the next checkpoint writes them
    and the record goes."""
    now = time.time_ns()
    two_hours_ago = now - 2 * 3600 * 10**9
    process = ServerProcess(
        database.target, "--checkpoint-signals", "6", "--checkpoint-seconds", "3600"
    )
    await process.start()
    async with await process.connect() as c:
        for user in (1, 2, 3):
            for at in (now, two_hours_ago):
                await c.signal(user, "song", "view", float(user), communities=["x"], at_ns=at)
        await c.signal(3, "other", "view", communities=["x"])  # a checkpoint holds the six
        ((watermark,),) = await database.rows("SELECT value FROM meta WHERE key = 'aggregates_seq'")
        assert int(watermark) >= 6, "no checkpoint holds the rows to be withdrawn"
        assert (await c.purge(1)).signals == 2
        assert (await c.erase(2)).signals == 2
    assert len(await database.rows("SELECT id FROM withdrawals")) == 2
    await process.kill9()

    async def kept_only_user_3() -> None:
        async with await process.connect() as c:
            counts = await c.counts("song")
            assert counts.ledger == {"view": Tally(4, 8.0)}  # users 1 (unforwarded) and 3
            assert counts.communities == {"x": {"view": Tally(2, 6.0)}}
            assert (await c.counts("song", window="1h")).communities == {
                "x": {"view": Tally(1, 3.0)}
            }
            assert (await c.counts("song", window="24h")).communities == {
                "x": {"view": Tally(2, 6.0)}
            }
            top = await c.top("community", "x", "view", by="weight", window="1h")
            assert [(e.entity, e.count, e.weight) for e in top.entities] == [
                ("song", 1, 3.0),
                ("other", 1, 1.0),
            ]

    await process.start()
    await kept_only_user_3()
    assert await process.stop() == 0  # the last checkpoint writes what the records took off
    assert await database.rows("SELECT id FROM withdrawals") == []
    assert (await database.board())["song", COMMUNITY, "x", "view"] == (2, 6.0)
    await process.start()
    await kept_only_user_3()
    assert await process.stop() == 0

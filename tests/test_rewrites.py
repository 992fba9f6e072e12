"""A purge's or erase's rows, rewritten after it took effect: what counts meanwhile, across a
kill -9, and what is left in the file once they are all rewritten.

``--rewrite-chunk 1`` makes each row a commit of its own, so that a few hundred rows take
long enough to be caught midway.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from array import array
from collections.abc import AsyncIterator

import asyncpg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidal.client import Client, Signal, Tally
from tidal.server.core import userrows
from tidal.server.core.batch import Batch
from tidal.server.core.rewrites import CHUNK, NO_RULE, SAVED, Pace, Rewrites, Rule, reach
from tidal.server.engine.linger import Linger

from .conftest import Database, ServerProcess
from .test_past import GOLD, as_dict, recompute

pytestmark = pytest.mark.both_backends
ROWS = 300  # user 7's
RULE_OF_7 = "SELECT 1 FROM rewrites WHERE user_id = 7"


async def seed(c: Client, rows: int = ROWS) -> None:
    await c.define_cohort("gold", GOLD)
    mine = [Signal(7, "song", "view", 1.0, ["x"], GOLD, key=f"k-{i}") for i in range(rows)]
    for start in range(0, rows, 100):
        await c.signal_batch(mine[start : start + 100])
    await c.signal_batch([Signal(8, "song", "view", 2.0, ["x"], GOLD) for _ in range(5)])


@contextlib.asynccontextmanager
async def writes_held(database: Database, committed: str | None = None) -> AsyncIterator[None]:
    """The ledger locked against writes from another session, so that the server's next
    chunk waits: the rows caught midway, however fast this machine commits.

    SQLite's lock is tried again at once, never through its busy handler: that sleeps
    between tries, and lost to a chunk a commit 3,000 times in a row on a loaded machine.
    With ``committed``, the lock is let go again until that query finds a row, so that it
    can be asked for before the write it is to follow, and is taken at the first gap after
    that write's commit."""
    if database.backend == "sqlite":
        db = await asyncio.to_thread(_sqlite_held, database.target, committed)
        try:
            yield
        finally:
            db.close()
        return
    conn = await asyncpg.connect(database.target)
    try:
        while True:
            await conn.execute("BEGIN")
            await conn.execute("LOCK TABLE ledger IN EXCLUSIVE MODE")  # a fair queue
            if committed is None or await conn.fetchrow(committed) is not None:
                break
            await conn.execute("ROLLBACK")
        yield
    finally:
        await conn.close()


def _sqlite_held(path: str, committed: str | None) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, timeout=0, check_same_thread=False)
    deadline = time.monotonic() + 60
    while True:
        try:
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                db.close()
                raise
            continue
        if committed is None or db.execute(committed).fetchone() is not None:
            return db
        db.execute("ROLLBACK")


async def rewritten(process: ServerProcess) -> None:
    """Returns once the server has deleted the last of an erase's rows. A graceful stop
    goes on rewriting for a few seconds only (boot resumes the rest); a chunk a commit
    takes longer than that for thousands of rows on a busy machine."""
    await process.logged(" rows deleted in ", timeout=120)


def only_user_8(counts: dict[str, object], ledger: Tally) -> None:
    assert counts == {
        "ledger": {"view": ledger},
        "cohorts": {"gold": {"view": Tally(5, 10.0)}},
        "communities": {"x": {"view": Tally(5, 10.0)}},
    }


async def rule_of(database: Database, user: int) -> list[tuple[int, int]]:
    return [
        tuple(row)
        for row in await database.rows(
            "SELECT purge_before, erase_before FROM rewrites WHERE user_id = ?", user
        )
    ]


async def test_a_purge_counts_at_once_its_rows_are_rewritten_later_and_a_kill_9_resumes(
    database: Database,
) -> None:
    rows = ROWS
    process = ServerProcess(database.target, "--rewrite-chunk", "1")
    await process.start()
    async with await process.connect() as c:
        await seed(c, rows)
        # the lock asked for before the purge, taken at the first gap after its commit:
        # taken after the ack, it once came only after 3,000 rows were all rewritten
        purge = asyncio.ensure_future(c.purge(7))
        async with writes_held(database, committed=RULE_OF_7):
            assert (await purge).signals == rows
            only_user_8(as_dict(await c.counts("song")), Tally(rows + 5, rows + 10.0))
            assert (await c.stats())["ledger_rewriting"] > 0  # a row a commit: hundreds to go
            # the file, read through its rule, says what the server counts, midway
            assert await recompute(database, "song") == as_dict(await c.counts("song"))
            await process.kill9()
    assert await rule_of(database, 7), "every row was rewritten before the kill: nothing resumed"
    unflipped = await database.rows(
        "SELECT COUNT(*) FROM ledger WHERE user_id = 7 AND forwarded = 1"
    )
    assert 0 < unflipped[0][0] <= rows

    # ten rows a commit from here: a graceful stop rewrites for 5 s at most
    process = ServerProcess(database.target, "--rewrite-chunk", "10")
    await process.start()
    async with await process.connect() as c:
        only_user_8(as_dict(await c.counts("song")), Tally(rows + 5, rows + 10.0))
        assert (await c.purge(7)).signals == 0  # its rows count as purged, rewritten or not
        assert (await c.erase(7)).signals == rows  # the ledger layer is all that was left
        only_user_8(as_dict(await c.counts("song")), Tally(5, 10.0))
        assert await recompute(database, "song") == as_dict(await c.counts("song"))
        again = await c.signal(7, "song", "view", key="k-3")  # an erased signal's key
        assert again.seq > rows + 5 and not again.forwarded  # a new row; 7 is Left
        await rewritten(process)
    assert await process.stop() == 0

    assert await rule_of(database, 7) == []
    kept = await database.rows("SELECT seq FROM ledger WHERE user_id = 7")
    assert kept == [(again.seq,)]  # only the signal after the erase
    keys = await database.rows("SELECT key, seq FROM signal_keys WHERE key LIKE 'k-%'")
    assert keys == [("k-3", again.seq)]
    listed = array("q")
    for (block,) in await database.rows("SELECT users FROM ledger_users"):
        listed.frombytes(block)
    assert listed.count(7) <= 1  # no trace of the erased rows; the new one may be listed


async def test_an_erase_midway_resumes_after_kill_9_and_forgets_its_keys(
    database: Database,
) -> None:
    # SQLite commits a chunk in a fraction of a millisecond, and its busy handler is not
    # fair: 300 rows were all deleted before the lock below was taken, three times on a
    # fresh machine, and 3,000 once; 9,000 take seconds more than the lock ever waited
    rows = ROWS * 30 if database.backend == "sqlite" else ROWS
    process = ServerProcess(database.target, "--rewrite-chunk", "1")
    await process.start()
    async with await process.connect() as c:
        await seed(c, rows)
        # pipelined, so that the lock below follows the erase by one round trip
        erased, retry = await asyncio.gather(
            c.erase(7),
            c.signal(7, "song", "view", key="k-1"),  # forgotten from the erase on
        )
        assert erased.signals == rows
        assert retry.seq == rows + 6 and not retry.forwarded
        async with writes_held(database):
            only_user_8(as_dict(await c.counts("song")), Tally(6, 11.0))
            await process.kill9()
    assert await rule_of(database, 7) == [(0, erased_before := rows + 6)]
    left = (await database.rows("SELECT COUNT(*) FROM ledger WHERE user_id = 7"))[0][0]
    assert 1 < left <= rows + 1, "every row was deleted before the kill: nothing resumed"

    await process.start()
    async with await process.connect() as c:
        only_user_8(as_dict(await c.counts("song")), Tally(6, 11.0))
        assert await recompute(database, "song") == as_dict(await c.counts("song"))
        assert (await c.stats())["ledger_rows"] == 6  # the rows still in the file count as gone
        # a key of a row still in the file, after boot: forgotten too
        late = await c.signal(7, "song", "view", key=f"k-{rows - 1}")
        assert late.seq == erased_before + 1
        await rewritten(process)
    assert await process.stop() == 0
    assert await rule_of(database, 7) == []
    seqs = [seq for (seq,) in await database.rows("SELECT seq FROM ledger WHERE user_id = 7")]
    assert sorted(seqs) == [retry.seq, late.seq]


async def test_a_second_erase_that_finds_nothing_keeps_the_first_one_s_keys_forgotten(
    database: Database,
) -> None:
    """A second erase finds no row the first has not taken; the first's rows, and their
    keys, are still being deleted a row a commit. A resend of one of those keys is a new
    signal, never the erased row's seq (issue 39, item 12: it was, under load)."""
    rows = ROWS * 10 if database.backend == "sqlite" else ROWS
    process = ServerProcess(database.target, "--rewrite-chunk", "1")
    await process.start()
    async with await process.connect() as c:
        await seed(c, rows)
        first, second = await asyncio.gather(c.erase(7), c.erase(7))
        resend, stats = await asyncio.gather(
            c.signal(7, "song", "view", key=f"k-{rows - 1}"), c.stats()
        )
        assert (first.signals, second.signals) == (rows, 0)
        assert stats["ledger_rewriting"] > 0, "every row was deleted already: nothing tested"
        assert resend.seq == rows + 6 and not resend.forwarded, resend  # a new row; 7 is Left
        await rewritten(process)
    assert await process.stop() == 0
    seqs = [seq for (seq,) in await database.rows("SELECT seq FROM ledger WHERE user_id = 7")]
    assert seqs == [resend.seq]


async def test_an_erase_s_rows_written_into_a_block_midway_are_still_found_after_kill_9(
    database: Database,
) -> None:
    """The erased user's rows were listed in memory (past the last block) when the erase
    took effect; more signals then fill the block, written while the rows are still being
    deleted. A kill -9 and a boot find them through that block and delete them all
    (issue 39, item 1: the block was written with them blanked already, so the boot found
    none, dropped the rule, and the erased rows counted again)."""
    rows = ROWS * 10
    process = ServerProcess(database.target, "--rewrite-chunk", "1")
    await process.start()
    async with await process.connect() as c:
        await seed(c, rows)
        filler = [Signal(9, "clip", "view") for _ in range(userrows.BLOCK)]
        erased, *_ = await asyncio.gather(c.erase(7), c.signal_batch(filler))
        assert erased.signals == rows
        # its batch was prepared after the filler committed: it writes the first block
        await c.signal(9, "clip", "view")
        async with writes_held(database):
            blocks = await database.rows("SELECT first_seq FROM ledger_users")
            assert (1,) in blocks, "the first block was not written: nothing tested"
            assert await rule_of(database, 7), "every row was deleted before the kill"
            await process.kill9()

    process = ServerProcess(database.target, "--rewrite-chunk", "100")
    await process.start()
    async with await process.connect() as c:
        only_user_8(as_dict(await c.counts("song")), Tally(5, 10.0))
        # issue 39, item 13: rows counted as the file holds them, erased ones not
        assert (await c.stats())["ledger_rows"] == 5 + userrows.BLOCK + 1
        await rewritten(process)
    assert await process.stop() == 0
    assert await rule_of(database, 7) == []
    assert await database.rows("SELECT COUNT(*) FROM ledger_counted") == [(5 + userrows.BLOCK + 1,)]
    assert await database.rows("SELECT COUNT(*) FROM ledger WHERE user_id = 7") == [(0,)]
    assert await recompute(database, "song") == {
        "ledger": {"view": Tally(5, 10.0)},
        "cohorts": {"gold": {"view": Tally(5, 10.0)}},
        "communities": {"x": {"view": Tally(5, 10.0)}},
    }


def test_a_rule_goes_with_the_last_chunk_of_its_user_and_not_before() -> None:
    """Sans I/O: chunks in order, and a rule kept while the user has more to rewrite or a
    withdrawal in the same commit."""
    rewrites = Rewrites({}, chunk=2)
    rewrites.took_effect(7, False, 10, [1, 3, 5])
    rewrites.took_effect(8, True, 10, [2])
    assert rewrites.rules == {7: Rule(10, 0), 8: Rule(0, 10)}
    first = rewrites.chunk(set())
    assert first is not None and (first.user, first.seqs, first.last) == (7, [1, 3], False)
    rewrites.committed(first)
    second = rewrites.chunk({7})  # a withdrawal of 7 in the same commit writes its rule anew
    assert second is not None and (second.seqs, second.last) == ([5], False)
    rewrites.committed(second)
    assert 7 in rewrites.rules and rewrites.pending() == 1
    third = rewrites.chunk(set())
    assert third is not None and (third.user, third.last) == (8, True)
    rewrites.committed(third)
    assert 8 not in rewrites.rules
    clearing = rewrites.chunk(set())  # 7's rule, with nothing left to rewrite
    assert clearing is not None and (clearing.user, clearing.seqs, clearing.last) == (7, [], True)
    rewrites.committed(clearing)
    assert rewrites.rules == {} and not rewrites.busy() and CHUNK > 1


def test_chunks_take_their_share_of_the_writer_s_time_and_save_up_little() -> None:
    """Sans I/O: a chunk riding a commit that requests wait on draws its time from a budget
    that grows at ``share`` of the time passing, and an idle spell saves up ``SAVED`` at
    most: after an hour unasked, two chunks of 10 ms do not both go at once."""
    pace = Pace(share=0.1)
    assert pace.due(100.0)
    pace.spent(0.010)  # a 10 ms commit: 5 ms saved, 10 spent
    assert not pace.due(100.04)  # 5 ms owed take 50 ms, at a tenth
    assert pace.due(100.06)
    assert pace.due(3700.0)  # an hour later: SAVED, no more
    pace.spent(0.010)
    assert not pace.due(3700.0 + (0.010 - SAVED) / 0.1 - 0.01)
    assert pace.due(3700.0 + (0.010 - SAVED) / 0.1 + 0.01)


async def test_a_commit_of_rewrites_alone_waits_for_a_write_unless_the_writer_is_idle() -> None:
    """A batch with nothing in it but the rewrites waits ``seconds`` for company; once one
    waited and nobody came, the writer is idle and the next go at once, until a write
    comes (under load, a commit of rewrites alone slipped in between every two)."""
    linger = Linger(seconds=0.001)
    empty = Batch(1)
    assert linger.wanted(empty)
    await linger.wait(empty)  # nobody came: the timer ends it
    assert not linger.wanted(empty) and not linger.wanted(Batch(1))
    joined = Batch(1)
    joined.writes = 1
    linger.joined(joined)  # a write came: the writer has company again
    company = Batch(2)
    assert linger.wanted(company)
    waiting = asyncio.ensure_future(linger.wait(company))
    await asyncio.sleep(0)  # it waits now
    company.writes = 1
    linger.joined(company)
    await waiting  # ended by the write, not the timer
    assert linger.wanted(Batch(3)) and not linger.wanted(joined)


def test_the_rule_a_row_is_read_through() -> None:
    rule = NO_RULE.wider(False, 10).wider(True, 5)
    assert [reach(rule, seq, 1) for seq in (4, 5, 9, 10)] == [-1, 0, 0, 1]
    assert reach(rule, 12, 0) == 0


async def test_a_clean_up_s_many_erasures_killed_midway_are_all_resumed_at_boot(
    database: Database,
) -> None:
    """Many users erased at once (as ``tidal bench`` cleans up), their rows across blocks,
    killed a row a commit in: the boot finds every rule's rows, the blocks read once for
    all of them, and deletes them all; nothing erased counts again meanwhile."""
    users = range(100, 100 + 2 * userrows.ONE_PASS)
    each = userrows.BLOCK // len(users) + 10  # so that their rows fill a block and go past it
    process = ServerProcess(database.target, "--rewrite-chunk", "1")
    await process.start()
    async with await process.connect() as c:
        await seed(c, 0)  # user 8's five, the cohort
        mine = [Signal(u, "song", "view", 1.0, ["x"], GOLD) for _ in range(each) for u in users]
        for start in range(0, len(mine), 500):
            await c.signal_batch(mine[start : start + 500])
        erased = await asyncio.gather(*(c.erase(u) for u in users))
        assert [e.signals for e in erased] == [each] * len(users)
        async with writes_held(database):
            assert len(await database.rows("SELECT user_id FROM rewrites")) > 1, "all rewritten"
            await process.kill9()

    await process.start()
    async with await process.connect() as c:
        only_user_8(as_dict(await c.counts("song")), Tally(5, 10.0))
        # with no request coming, the rows were left until the idle writer's next probe of
        # the database, 60 s on: the boot wakes it
        for u in users:
            await process.logged(f"user {u}: ", timeout=30)  # the last of its rows deleted
        assert (await c.stats())["ledger_rewriting"] == 0
    assert await process.stop() == 0
    assert await rule_of(database, 100) == []
    assert await database.rows("SELECT COUNT(*) FROM ledger WHERE user_id >= 100") == [(0,)]
    assert await database.rows("SELECT COUNT(*) FROM rewrites") == [(0,)]


@given(
    entries=st.lists(st.sampled_from([1, 2, 256, 257, 1 << 40, (1 << 40) + 1]), max_size=60),
    users=st.sets(st.sampled_from([1, 2, 256, 257, 1 << 40, 3, 4, 5, 6, 7, 8, 9]), max_size=12),
)
def test_finding_many_users_at_once_finds_what_finding_each_finds(
    entries: list[int], users: set[int]
) -> None:
    """Sans I/O: each block's entries read at once (from ``ONE_PASS`` users on) or each
    user's bytes searched for, the same seqs; bytes that straddle two entries never match."""
    blocks = [(1 + at, userrows.pack(entries[at : at + 16])) for at in range(0, len(entries), 16)]
    expected = {u: [s + 1 for s, e in enumerate(entries) if e == u] for u in users}
    assert userrows.find_all(blocks, users) == {u: s for u, s in expected.items() if s}

"""The board on disk (``core.chunks``), written and read back with a real SQLite file and
the plans the server runs, without a server: after any mix of signals, withdrawals,
cohorts dropped and time passing, with chunks and parts small enough that the log is
cleaned and buckets merged again and again, a board rebuilt from the rows equals the
board that wrote them, tally by tally and bucket by bucket. And a database of the row
tables of before is read, and moved."""

from __future__ import annotations

import math
import random
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tidal.server.core import chunks, restore
from tidal.server.core.board import Board
from tidal.server.core.chunks import Shelf, Written
from tidal.server.core.ledger import COMMUNITY
from tidal.server.core.sums import aggregate_rows, bucket_rows
from tidal.server.core.tallies import Contribution
from tidal.server.core.windows import HOUR_NS, MINUTE_NS
from tidal.server.storage import boot, buckets
from tidal.server.storage.interface import Snapshot
from tidal.server.storage.sqlbulk import SQLITE, Begin, Commit, Plan
from tidal.server.storage.sqlite.sqlite_schema import MIGRATIONS
from tidal.server.storage.sqlite.sqlite_storage import run

from .conftest import Database, ServerProcess

HALF_LIVES = (3600, 6 * 3600)
DAY_NS = 24 * HOUR_NS


@pytest.fixture
def db(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(tmp_path / "board.db", isolation_level=None)
    for migration in MIGRATIONS:
        for statement in migration:
            conn.execute(statement)
    yield conn
    conn.close()


def load(db: sqlite3.Connection, now: int) -> Snapshot:
    return run(db, boot.load(SQLITE, 0, 10, HALF_LIVES, now))


def rebuilt(db: sqlite3.Connection, now: int, cohorts: set[int]) -> tuple[Board, Shelf]:
    on_disk = load(db, now).board
    board, shelf = Board(on_disk.decay, now), Shelf(chunk=7, part_slack=1)
    restore.rebuild(board, shelf, on_disk, [], cohorts)
    return board, shelf


def checkpoint(db: sqlite3.Connection, board: Board, shelf: Shelf, now: int) -> Written:
    changed = board.take_dirty()

    def plan() -> Plan[Written]:
        yield Begin()
        written = yield from buckets.checkpoint(board, shelf, changed, now)
        yield Commit()
        return written

    written = run(db, plan())
    chunks.done(board, shelf, written)
    return written


def state(board: Board) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    """Everything a read can see of each tally: totals, windows, decayed sums, buckets."""
    out = {}
    for slot, scope in board.scopes.items():
        for entity, tally in scope.tallies.items():
            held = []
            for tier, kept in enumerate(board.buckets):
                for b in sorted(kept):
                    entry = board.entry(tally, tier, b)
                    if entry is not None:
                        held.append((tier, b, entry))
            windows = tuple(tally.window(i) for i in range(4))
            out[entity, slot] = (tally.count, tally.weight, windows, tuple(tally.trends()), held)
    return out


@pytest.mark.parametrize("seed", range(12))
def test_a_board_rebuilt_from_its_chunks_and_parts_is_the_board_that_wrote_them(
    db: sqlite3.Connection, seed: int
) -> None:
    rng = random.Random(seed)
    now = 1_800_000_000 * 10**9
    decay = load(db, now).board.decay
    board, shelf = Board(decay, now), Shelf(chunk=7, part_slack=1)
    cohorts = {1, 2, 3}
    next_cohort = 4
    added: list[Contribution] = []
    cleaned = merged = 0
    for round_ in range(40):
        now += rng.choice((0, 0, 0, MINUTE_NS // 2, MINUTE_NS, 7 * MINUTE_NS, HOUR_NS, DAY_NS))
        board.advance(now)
        batch: list[Contribution] = []
        for _ in range(rng.randrange(1, 30)):
            ago = rng.choice(
                (0, 0, 0, MINUTE_NS, 50 * MINUTE_NS, 5 * HOUR_NS, 3 * DAY_NS, 40 * DAY_NS)
            )
            batch.append(
                (
                    f"e{rng.randrange(25)}",
                    rng.choice(("view", "like")),
                    1,
                    float(rng.randrange(1, 4)),
                    now - ago - rng.randrange(MINUTE_NS),
                    tuple(c for c in sorted(cohorts) if rng.random() < 0.3),
                    tuple(n for n in ("a", "b") if rng.random() < 0.4),
                    True,
                )
            )
        board.add(batch)
        added += batch
        for _ in range(rng.randrange(0, 6)):  # a purge (not the ledger layer) or an erase
            if not added:
                break
            entity, kind, _, weight, at, cids, names, _ = added.pop(rng.randrange(len(added)))
            erase = rng.random() < 0.5
            board.add([(entity, kind, -1, -weight, at, cids, names, erase)])
            if not erase:  # its ledger layer stays
                added.append((entity, kind, 1, weight, at, (), (), True))
        if rng.random() < 0.1:  # a cohort dropped, another defined
            gone = rng.choice(sorted(cohorts))
            cohorts = (cohorts - {gone}) | {next_cohort}
            next_cohort += 1
            board.keep_cohorts(cohorts)
            added = [
                (e, k, s, w, at, tuple(c for c in cids if c in cohorts), n, lt)
                for e, k, s, w, at, cids, n, lt in added
            ]
        written = checkpoint(db, board, shelf, now)
        cleaned += len(written.cleaned)
        merged += len(written.merged)
        if round_ % 3 == 2:
            again, shelf = rebuilt(db, now, cohorts)
            assert state(again) == state(board), f"round {round_}"
            board = again
    assert cleaned and merged, "the log was never cleaned or no bucket merged: test nothing"


async def answers(process: ServerProcess) -> list[Any]:
    """What a client sees of the board: counts in every window, and rankings."""
    async with await process.connect() as c:
        seen: list[Any] = []
        for entity in ("song", "film", "book"):
            for window in ("all", "1h", "24h", "7d", "30d"):
                counts = await c.counts(entity, window=window)
                seen.append((entity, window, counts.ledger, counts.communities))
        for by in ("count", "weight", "trend"):  # a trend's score moves with the clock
            top = await c.top("community", "jazz", "view", by=by)
            seen.append([(e.entity, e.count, e.weight) for e in top.entities])
        return seen


@pytest.mark.both_backends
async def test_a_board_in_the_row_tables_of_before_is_read_and_moved_to_chunks(
    database: Database,
) -> None:
    """A database the release before wrote keeps its board a row per aggregate and bucket
    (``aggregates``, ``buckets``): boot reads it from there, the first checkpoint writes it
    all as chunks and parts and empties those tables, and every answer stays the same."""
    now = time.time_ns()
    process = ServerProcess(database.target)
    await process.start()
    async with await process.connect() as c:
        for user, (entity, ago, weight) in enumerate(
            [
                ("song", 0, 1.0),
                ("song", 2 * HOUR_NS, 2.5),
                ("film", 3 * DAY_NS, 1.0),
                ("book", 10 * DAY_NS, 4.0),
                ("song", 20 * MINUTE_NS, 1.0),
            ]
        ):
            await c.signal(user, entity, "view", weight, communities=["jazz"], at_ns=now - ago)
    assert await process.stop() == 0
    before = await answers(await process.start())
    assert await process.stop() == 0
    # the release before: the board as rows, summed from the ledger the way it summed them
    meta = dict(await database.rows("SELECT key, value FROM meta"))
    assert int(meta["aggregates_seq"]) == 5, "the last checkpoint holds every row"
    decay = [(21600, int(meta["trend_base_21600"]))]
    ledger = await database.rows(
        "SELECT seq, entity, kind, weight, forwarded, context, COALESCE(at_ns, ts_ns)"
        " FROM ledger_counted"
    )
    contributions = [restore.from_row(row) for row in ledger]
    for row in aggregate_rows(contributions):
        await database.rows(
            "INSERT INTO aggregates (entity, layer, cohort, name, kind, count, weight)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            *row,
        )
    for row in bucket_rows(contributions, decay, time.time_ns()):
        await database.rows(
            "INSERT INTO buckets (entity, layer, cohort, name, kind, tier, bucket, count, weight)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            *row,
        )
    await database.rows("DELETE FROM board_chunks")
    await database.rows("DELETE FROM board_parts")
    assert await answers(await process.start()) == before
    assert await process.stop() == 0  # its last checkpoint moves it
    assert await database.rows("SELECT count(*) FROM aggregates") == [(0,)]
    assert await database.rows("SELECT count(*) FROM buckets") == [(0,)]
    assert (await database.board())["song", COMMUNITY, "jazz", "view"] == (3, 4.5)
    assert await answers(await process.start()) == before
    assert await process.stop() == 0


@pytest.mark.both_backends
async def test_a_half_life_not_seen_before_is_filled_from_the_ledger_and_kept(
    database: Database,
) -> None:
    """The chunks hold the sums of the half-lives they were written with: one added at boot
    is summed from the ledger, written with the rest at the first checkpoint, and read back
    from the chunks after."""
    now = time.time_ns()
    first = ServerProcess(database.target)
    await first.start()
    async with await first.connect() as c:
        for user, hours in enumerate((0, 1, 3)):
            await c.signal(user, f"song{hours}", "view", 8.0, communities=["jazz"],
                           at_ns=now - hours * HOUR_NS)  # fmt: skip
    assert await first.stop() == 0
    both = ServerProcess(database.target, "--trend-half-lives", "6h,1h")
    for _ in range(2):
        await both.start()
        async with await both.connect() as c:
            top = await c.top("community", "jazz", "view", by="trend", half_life="1h")
            assert [e.entity for e in top.entities] == ["song0", "song1", "song3"]
            age = (top.as_of_ns - now) / HOUR_NS
            for e, hours in zip(top.entities, (0, 1, 3), strict=True):
                assert math.isclose(e.score, 8.0 * 2.0 ** -(hours + age), rel_tol=1e-9), e
        assert await both.stop() == 0
    log = b"".join(both.log).decode()
    assert "filled the 1h trend" not in log, "the second boot read it from the chunks"

"""kill -9 under load, again and again: nothing acknowledged is ever lost.

CI runs 20 cycles; ``make crash`` runs 200 (TIDAL_CRASH_CYCLES).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sqlite3
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import pytest

from tidal.client import Client, ConnectionLost, Signal

from .conftest import Database, ServerProcess
from .test_aggregates import LEDGER_ROWS, as_wire, recompute
from .test_properties import DAY_NS, HOUR_NS, MIN_NS, in_window

CYCLES = int(os.environ.get("TIDAL_CRASH_CYCLES", "20"))
USERS = 30
ENTITIES = [f"e{i}" for i in range(6)]


@dataclass
class Ledger:
    """What the clients were told, and what they only asked for."""

    acked: dict[int, tuple[int, str]] = field(default_factory=dict)  # seq -> (user, entity)
    membership: dict[int, str] = field(default_factory=dict)  # user -> last acknowledged status
    in_doubt: set[int] = field(default_factory=set)  # users with a change sent, not answered
    counts: int = 0  # operations answered
    target: int = 0  # crash once this many have been answered
    reached: asyncio.Event = field(default_factory=asyncio.Event)


async def client_load(
    c: Client, rng: random.Random, book: Ledger, stop: asyncio.Event, n: int, of: int
) -> None:
    """Each client changes memberships of its own users only (user % of == n): replies to
    different connections may resume their callers in any order, so only one client's
    sequence of acknowledgements tells which change came last."""
    try:
        while not stop.is_set():
            roll = rng.random()
            user = rng.randrange(USERS)
            if roll < 0.15:
                user = rng.randrange(USERS // of) * of + n  # one of this client's own
                op = "leave" if rng.random() < 0.5 else "rejoin"
                book.in_doubt.add(user)
                membership = await (c.leave(user) if op == "leave" else c.rejoin(user))
                book.membership[user] = membership.status
                book.in_doubt.discard(user)
            elif roll < 0.17:  # the past out of every ranking (checked against the ledger)
                await c.purge(rng.randrange(USERS))
            elif roll < 0.3:
                items = [
                    Signal(rng.randrange(USERS), rng.choice(ENTITIES), "view", 1.0, ["c"])
                    for _ in range(rng.randrange(1, 20))
                ]
                acks = await c.signal_batch(items)
                for item, ack in zip(items, acks, strict=True):
                    book.acked[ack.seq] = (item.user_id, item.entity)
            else:
                entity = rng.choice(ENTITIES)
                age = rng.choice(AGES)  # late signals, days old, counted where they fall
                at = None if age is None else time.time_ns() - age
                ack = await c.signal(user, entity, "view", communities=["c"], at_ns=at)
                book.acked[ack.seq] = (user, entity)
            book.counts += 1
            if book.counts >= book.target:
                book.reached.set()
    except ConnectionLost:
        return


async def one_cycle(process: ServerProcess, rng: random.Random, book: Ledger) -> None:
    await process.start()
    stop = asyncio.Event()
    book.reached.clear()
    book.target = book.counts + rng.randrange(20, 400)  # crash at a random point of the load
    clients = [await process.connect() for _ in range(3)]
    load = [
        asyncio.create_task(client_load(c, rng, book, stop, n, len(clients)))
        for n, c in enumerate(clients)
    ]
    await asyncio.wait_for(book.reached.wait(), 60)
    await process.kill9()
    stop.set()
    await asyncio.gather(*load)
    for c in clients:
        await c.close()


async def check(process: ServerProcess, book: Ledger, db: Database) -> list[str]:
    """Everything that contradicts what was acknowledged; empty when all holds."""
    wrong: list[str] = []
    await process.start()
    async with await process.connect() as c:
        for user in book.in_doubt:  # a change was sent, not answered: either state may hold,
            book.membership[user] = (await c.status(user)).status  # and what holds is the truth
        for user, status in book.membership.items():
            got = (await c.status(user)).status
            if got != status:
                wrong.append(f"user {user}: acknowledged {status}, found {got}")
        query = "SELECT seq, user_id, entity FROM ledger"
        rows = {seq: (user, entity) for seq, user, entity in await db.rows(query)}
        names = dict(await db.rows("SELECT id, name FROM cohorts"))
        for seq, row in book.acked.items():
            if rows.get(seq) != row:
                wrong.append(f"acknowledged signal seq {seq} {row} is missing: {rows.get(seq)}")
        expected = recompute(await db.rows(LEDGER_ROWS), names)
        for entity in ENTITIES:
            want = expected.get(entity, {"ledger": {}, "cohorts": {}, "communities": {}})
            if as_wire(await c.counts(entity)) != want:
                wrong.append(f"aggregates of {entity} differ from a recompute")
        ledger = await db.rows(RANKED_ROWS)
        for window in (None, "1h", "7d"):
            top = await c.top("community", "c", "view", window=window)
            shown = [(r.entity, r.count) for r in top.entities]
            if shown != ranked(ledger, window, top.as_of_ns):
                wrong.append(f"top in window {window}: {shown} is not a recompute")
    await process.stop()
    if db.backend == "sqlite":
        with contextlib.closing(sqlite3.connect(db.target)) as file:
            result = file.execute("PRAGMA quick_check").fetchone()
        if result != ("ok",):
            wrong.append(f"quick_check: {result}")
    return wrong


RANKED_ROWS = "SELECT entity, forwarded, context, COALESCE(at_ns, ts_ns) FROM ledger_counted"
AGES = [None, None, 0, 30 * MIN_NS, 3 * HOUR_NS, 2 * DAY_NS, 10 * DAY_NS, 40 * DAY_NS]


def ranked(rows: list[tuple[Any, ...]], window: str | None, now_ns: int) -> list[tuple[str, int]]:
    """Community c's top 10 by count, recomputed from the ledger's rows (``RANKED_ROWS``)."""
    counts: dict[str, int] = {}
    for entity, forwarded, context, at_ns in rows:
        reached = forwarded and context and "c" in msgpack.unpackb(context, raw=False)[0]
        if reached and in_window(at_ns, window, now_ns):
            counts[entity] = counts.get(entity, 0) + 1
    return sorted(counts.items(), key=lambda e: (-e[1], e[0]))[:10]


@pytest.mark.both_backends
async def test_kill_9_under_load_loses_nothing_acknowledged(database: Database) -> None:
    process = ServerProcess(database.target)
    rng = random.Random(int(os.environ.get("TIDAL_CRASH_SEED", "7")))
    book = Ledger()
    for cycle in range(CYCLES):
        await one_cycle(process, rng, book)
        wrong = await check(process, book, database)
        assert not wrong, f"cycle {cycle}: " + "; ".join(wrong[:5])
        book.in_doubt.clear()
    print(
        f"{CYCLES} kill -9 cycles: {len(book.acked)} signals and"
        f" {len(book.membership)} memberships acknowledged, none lost"
    )


async def test_the_check_catches_a_server_that_acks_before_committing(database: Database) -> None:
    unsafe = [sys.executable, str(Path(__file__).with_name("unsafe_server.py"))]
    process = ServerProcess(database.target, launcher=unsafe)
    rng = random.Random(3)
    book = Ledger()
    for cycle in range(CYCLES):
        await one_cycle(process, rng, book)
        if wrong := await check(process, book, database):
            print(f"caught in cycle {cycle}: {wrong[0]}")
            return
        book.in_doubt.clear()
    pytest.fail(f"{CYCLES} cycles of kill -9 did not catch acknowledgements before commit")

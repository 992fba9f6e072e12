"""Aggregates are a checkpointed view of the ledger: they must always equal a recompute."""

from __future__ import annotations

import asyncio
import random
import re
from collections import defaultdict
from typing import Any

import msgpack
import pytest

from tidal.client import Client, Counts, Signal, Unavailable
from tidal.server import Config, Server

from .conftest import Database, ServerProcess
from .test_durability import fail_once

pytestmark = pytest.mark.both_backends
WATERMARK = "SELECT value FROM meta WHERE key = 'aggregates_seq'"


LEDGER_ROWS = "SELECT entity, kind, weight, forwarded, context FROM ledger_counted ORDER BY seq"


def recompute(rows: list[tuple[Any, ...]], cohort_names: dict[int, str]) -> dict[str, Any]:
    """Every entity's counts, from the ledger rows alone (``LEDGER_ROWS``)."""
    out: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"ledger": {}, "cohorts": {}, "communities": {}}
    )

    def bump(where: dict[str, Any], kind: str, weight: float) -> None:
        tally = where.setdefault(kind, {"count": 0, "weight": 0.0})
        tally["count"] += 1
        tally["weight"] += weight

    for entity, kind, weight, forwarded, context in rows:
        bump(out[entity]["ledger"], kind, weight)
        if forwarded and context:
            communities, _, cohorts = msgpack.unpackb(context, raw=False)
            for cid in cohorts:
                if cid in cohort_names:
                    bump(out[entity]["cohorts"].setdefault(cohort_names[cid], {}), kind, weight)
            for name in communities:
                bump(out[entity]["communities"].setdefault(name, {}), kind, weight)
    return out


def as_wire(counts: Counts) -> dict[str, Any]:
    def tallies(by_kind: dict[str, Any]) -> dict[str, Any]:
        return {k: {"count": t.count, "weight": t.weight} for k, t in by_kind.items()}

    return {
        "ledger": tallies(counts.ledger),
        "cohorts": {n: tallies(v) for n, v in counts.cohorts.items()},
        "communities": {n: tallies(v) for n, v in counts.communities.items()},
    }


async def load(client: Client, db: Database, rng: random.Random, n: int) -> None:
    """Signals with integer weights (so sums are exact), leaves and rejoins, cohorts changing."""
    for i in range(n):
        user = rng.randrange(40)
        roll = rng.random()
        if roll < 0.05:
            await client.leave(user)
        elif roll < 0.1:
            await client.rejoin(user)
        elif roll < 0.12:
            await client.define_cohort(f"k{rng.randrange(3)}", {"tier": rng.randrange(3)})
        elif roll < 0.13:
            await client.drop_cohort(f"k{rng.randrange(3)}")
        else:
            await client.signal_batch(
                [
                    Signal(
                        user,
                        f"e{rng.randrange(5)}",
                        rng.choice(("view", "like")),
                        float(rng.randrange(1, 4)),
                        communities=[f"c{rng.randrange(4)}"] * rng.randrange(2),
                        attrs={"tier": rng.randrange(3)},
                    )
                    for _ in range(rng.randrange(1, 4))
                ]
            )
        if i % 50 == 0:
            await check(client, db)


async def check(client: Client, db: Database) -> None:
    names = dict(await db.rows("SELECT id, name FROM cohorts"))
    expected = recompute(await db.rows(LEDGER_ROWS), names)
    for entity in [f"e{i}" for i in range(5)]:
        got = as_wire(await client.counts(entity))
        want = expected.get(entity, {"ledger": {}, "cohorts": {}, "communities": {}})
        assert got == want, entity


async def test_counts_equal_a_recompute_across_many_checkpoints(database: Database) -> None:
    config = Config(port=0, db=database.target, checkpoint_signals=7, checkpoint_seconds=3600)
    server = Server(config)
    await server.start()
    try:
        async with await Client.connect(*server.address) as client:
            await load(client, database, random.Random(11), 600)
            await check(client, database)
            ((watermark,),) = await database.rows(WATERMARK)
            assert watermark > 0, "no checkpoint was written"
    finally:
        await server.shutdown()
    # a clean shutdown checkpoints everything: the table alone equals the ledger
    ((watermark,),) = await database.rows(WATERMARK)
    ((last,),) = await database.rows("SELECT MAX(seq) FROM ledger")
    assert watermark == last


async def test_a_refused_commit_takes_back_what_its_signals_counted(database: Database) -> None:
    """Signals are counted once their batch has committed: a commit refused (here one
    carrying a checkpoint) counts none of its own, the next writes what its checkpoint
    held, and what is left equals a recompute, before and after a restart."""
    server = Server(Config(port=0, db=database.target, checkpoint_signals=2))
    await server.start()
    try:
        fail_once(server, lambda batch: batch.board_changed is not None and bool(batch.signals))
        async with await Client.connect(*server.address) as client:
            refused = 0
            for i in range(12):
                try:
                    await client.signal(i % 3, f"e{i % 2}", "view", communities=["c"])
                except Unavailable:
                    refused += 1
            assert refused == 1
            await check(client, database)
            assert (await client.stats())["signals"] == 11
    finally:
        await server.shutdown()
    server = Server(Config(port=0, db=database.target))
    await server.start()
    try:
        async with await Client.connect(*server.address) as client:
            await check(client, database)
    finally:
        await server.shutdown()


async def test_counts_under_concurrent_writes_never_go_back(database: Database) -> None:
    """Counts read beside the writer, across many commits and checkpoints, as writers go
    on: each shows at least what the last did, never more than was sent, and at the end
    exactly what was acknowledged."""
    server = Server(Config(port=0, db=database.target, checkpoint_signals=50))
    await server.start()
    per_writer, writers = 300, 4
    try:
        clients = [await Client.connect(*server.address) for _ in range(writers + 1)]
        reader = clients[-1]

        async def write(c: Client, w: int) -> None:
            for start in range(0, per_writer, 20):
                await asyncio.gather(
                    *(
                        c.signal(w * 1000 + start + i, "hot", "view", communities=["c"])
                        for i in range(20)
                    )
                )

        done = asyncio.gather(*(write(c, w) for w, c in enumerate(clients[:writers])))
        seen, reads = 0, 0
        while not done.done():
            counts = await reader.counts("hot")
            now = counts.ledger["view"].count if counts.ledger else 0
            assert seen <= now <= per_writer * writers, (seen, now)
            assert (counts.communities["c"]["view"].count if now else 0) == now
            seen, reads = now, reads + 1
        await done
        assert reads > 10, "the reads did not overlap the writes"
        final = await reader.counts("hot")
        assert final.ledger["view"].count == per_writer * writers
        for c in clients:
            await c.close()
    finally:
        await server.shutdown()


async def test_kill_9_between_checkpoints_replays_the_ledger(
    process: ServerProcess, database: Database
) -> None:
    await process.start()
    rng = random.Random(5)
    async with await process.connect() as client:
        await load(client, database, rng, 300)
    await process.kill9()
    await process.start()
    replayed = [re.search(rb"(\d+) ledger rows replayed", line) for line in process.log]
    assert any(m and int(m.group(1)) > 0 for m in replayed), b"".join(process.log)
    async with await process.connect() as client:
        await check(client, database)
        await load(client, database, rng, 100)
        await check(client, database)


async def test_the_ledger_keeps_what_every_signal_named(client: Client, database: Database) -> None:
    await client.signal(1, "e", "view", attrs={"plan": "pro"})  # forwarded, matched nothing
    await client.leave(2)
    await client.signal(2, "e", "view", attrs={"plan": "free"}, communities=["c"])  # gated
    await client.signal(3, "e", "view")  # named nothing
    rows = await database.rows(
        "SELECT user_id, forwarded, context FROM ledger_counted ORDER BY seq"
    )
    contexts = [(u, f, msgpack.unpackb(c) if c else None) for u, f, c in rows]
    assert contexts == [
        (1, 1, [[], {"plan": "pro"}, []]),
        (2, 0, [["c"], {"plan": "free"}, []]),
        (3, 1, None),
    ]

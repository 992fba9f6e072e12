"""Weights that would wedge storage: refused at the edge, and survived when already stored.

A sum of 1e308 and 1e308 is inf; inf and -inf make NaN, which SQLite stores as
NULL, which the aggregates table refuses, so every checkpoint would fail and
latch storage, on every boot. Weights are bounded so that no sum can overflow.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tidal.client import Client, InvalidParams, Signal
from tidal.server import Config, Server


async def test_weights_past_the_bound_are_refused_and_change_nothing(client: Client) -> None:
    for weight in (1e308, -1e308, 1e12 * 1.5, 10**13):
        with pytest.raises(InvalidParams, match=r"weight: must be a number in -1e\+12..1e\+12"):
            await client.signal(1, "e", "view", weight)
        with pytest.raises(InvalidParams, match=r"signals\[1\].weight"):
            await client.signal_batch([Signal(1, "e", "view"), Signal(1, "e", "view", weight)])
    assert (await client.counts("e")).ledger == {}
    await client.signal(1, "e", "view", 1e12)
    await client.signal(1, "e", "view", -1e12)
    tally = (await client.counts("e")).ledger["view"]
    assert (tally.count, tally.weight) == (2, 0.0)


async def test_huge_weights_an_older_tidal_stored_do_not_wedge_the_boot(db_path: Path) -> None:
    server = Server(Config(port=0, db=str(db_path)))
    await server.start()
    async with await Client.connect(*server.address) as c:
        await c.signal(1, "e", "view", communities=["c"])
    await server.shutdown()
    with sqlite3.connect(db_path) as db:  # as the unbounded version left them, in the row
        # tables of then: a checkpoint that summed to inf, then two signals of -1e308 past it
        db.execute("DELETE FROM board_chunks")
        db.execute("DELETE FROM board_parts")
        db.execute(
            "INSERT INTO aggregates (entity, layer, cohort, name, kind, count, weight)"
            " VALUES ('e', 0, 0, '', 'view', 1, 9e999), ('e', 2, 0, 'c', 'view', 1, 1.0)"
        )
        for seq in (2, 3):
            db.execute(
                "INSERT INTO ledger (seq, user_id, entity, kind, weight, ts_ns, forwarded, context)"
                " VALUES (?, 1, 'e', 'view', -1e308, 0, 0, NULL)",
                (seq,),
            )
    for _ in range(2):  # each boot replays, checkpoints, and must stay healthy
        server = Server(Config(port=0, db=str(db_path), checkpoint_signals=1))
        await server.start()
        try:
            async with await Client.connect(*server.address) as c:
                await c.signal(2, "e", "view")  # a checkpoint is due: it must commit
                await c.signal(3, "e", "view")
                assert await c.health() == {"status": "ok", "storage": "ok", "memory": "ok"}
                tally = (await c.counts("e")).ledger["view"]
                assert tally.weight == float("inf")  # what was stored; not NaN
        finally:
            await server.shutdown()

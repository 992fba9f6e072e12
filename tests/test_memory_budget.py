"""The memory budget (``--memory-budget``): the aggregates the board keeps in memory are
bounded, a write that would pass the bound is refused whole with error 2 ``full:``, and
everything else goes on. Before it, 15 requests of 200 signals with 1,000 cohorts {}
and 64 communities each grew the server by 1.75 GB, and a few more had the kernel's OOM
killer end it with every client's writes in flight."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest

from tidal.client import Client, Signal
from tidal.client.errors import Unavailable
from tidal.server import Config, Server
from tidal.server.core.batch import Batch
from tidal.server.core.budget import ENTITY_BYTES, TALLY_BYTES

from .conftest import Database, ServerProcess
from .test_durability import wrap_commit
from .test_hostile import rss_kib

pytestmark = pytest.mark.both_backends

COHORTS = 20
COMMUNITIES = [f"m{j}" for j in range(10)]
BUDGET = 40 * 2**20


def wide(r: int, i: int, user: int) -> Signal:
    """A signal on an entity of its own, reaching 31 aggregates (ledger, 20 cohorts and
    10 communities)."""
    return Signal(user, f"e{r}.{i}", "v", communities=COMMUNITIES)


async def test_past_the_budget_only_writes_creating_aggregates_are_refused(
    database: Database,
) -> None:
    proc = await ServerProcess(database.target, "--memory-budget", "40M").start()
    assert proc.proc is not None
    try:
        async with await proc.connect() as client:
            for c in range(COHORTS):
                assert await client.define_cohort(f"all{c}", {})
            first = await client.signal(1, "e0.0", "v", communities=COMMUNITIES, key="k-first")
            acked = 1
            before = rss_kib(proc.proc.pid)
            refusal: Unavailable | None = None
            fit = BUDGET // (31 * TALLY_BYTES + ENTITY_BYTES) // 100  # requests of 100
            for r in range(1, 60):
                try:
                    await client.signal_batch([wide(r, i, 1000 + i) for i in range(100)])
                except Unavailable as exc:
                    refusal = exc
                    break
                acked += 100
            assert refusal is not None, "the budget never refused a write"
            assert refusal.full and "--memory-budget 40M" in refusal.message, refusal.message
            assert fit - 5 <= (acked - 1) // 100 <= fit, f"refused after {acked} signals"
            grown = rss_kib(proc.proc.pid) * 1024 - before * 1024
            assert grown < BUDGET * 1.25, f"the server grew {grown} bytes on a 40M budget"

            # smaller writes fill what is left, to under 1%: health and stats say so
            small = 0  # user 2's
            for i in range(400):
                try:
                    await client.signal(2, f"small{i}", "v")
                except Unavailable as exc:
                    refusal = exc
                    break
                small += 1
            else:
                pytest.fail("400 small writes of new entities all fit in what was left")
            assert refusal.full, refusal.message
            health = await client.health()
            assert health["status"] == "ok" and health["memory"] == "full", health
            stats = await client.stats()
            assert stats["writes_refused_full"] >= 2, stats
            assert stats["aggregates_bytes"] <= stats["memory_budget"] == BUDGET, stats

            # what only adds to aggregates held goes on, a left user's signal included, and
            # a retry of an acknowledged key gets its first answer, not a refusal
            await client.signal(3, "e1.0", "v", communities=COMMUNITIES)
            assert (await client.leave(4)).left
            assert (await client.signal(4, "e1.1", "v")).forwarded is False
            again = await client.signal(5, "brand-new", "v", key="k-first")
            assert again.seq == first.seq
            acked += 2
            with pytest.raises(Unavailable) as new:
                await client.signal(6, "brand-new", "v")
            assert new.value.full
            # reads and the rest of the writes
            counts = await client.counts("e1.0")
            assert counts.ledger["v"].count == 2 and counts.communities["m3"]["v"].count == 2
            assert counts.cohorts["all0"]["v"].count == 2
            assert (await client.top("community", "m0", "v", limit=1)).entities[0].count == 2
            assert not (await client.rejoin(4)).left
            # a purge withdraws from cohorts and communities, and makes room
            for i in range(100):
                await client.purge(1000 + i)
            health = await client.health()
            assert health["memory"] == "ok", health
            await client.signal(6, "brand-new", "v", communities=COMMUNITIES)
            acked += 1 + small
            assert (await client.erase(2)).signals == small > 0
            stats = await client.stats()
            assert stats["signals"] == acked, stats
        # nothing acknowledged is lost: all of it is in the ledger after a restart
        await proc.stop()
        await proc.start()
        async with await proc.connect() as client:
            stats = await client.stats()
            assert stats["ledger_rows"] == acked - small, stats
            counts = await client.counts("e1.0")
            assert counts.ledger["v"].count == 2 and counts.cohorts["all0"]["v"].count == 1
    finally:
        await proc.stop()


@pytest.mark.parametrize(("per_entity", "entities"), [(1, 60_000), (31, 4_000)])
async def test_the_budget_counts_no_less_than_the_aggregates_take(
    db_path: Path, per_entity: int, entities: int
) -> None:
    """``TALLY_BYTES`` and ``ENTITY_BYTES`` are what the server grows by, or a little more:
    a budget that undercounted would let it pass the memory it was given."""
    proc = await ServerProcess(db_path, "--memory-budget", "0").start()
    assert proc.proc is not None
    try:
        async with await Client.connect("127.0.0.1", proc.port, timeout=10) as client:
            for c in range(COHORTS if per_entity > 1 else 0):
                await client.define_cohort(f"all{c}", {})
            communities = COMMUNITIES if per_entity > 1 else []
            before = rss_kib(proc.proc.pid) * 1024
            for r in range(0, entities, 1000):
                await client.signal_batch(
                    [Signal(i, f"e{r + i}", "v", communities=communities) for i in range(1000)]
                )
            grown = rss_kib(proc.proc.pid) * 1024 - before
            stats = await client.stats()
        assert stats["aggregates"] == per_entity * entities
        counted = stats["aggregates_bytes"]
        assert counted == entities * (per_entity * TALLY_BYTES + ENTITY_BYTES)
        assert 0.7 * counted <= grown <= counted, (
            f"{per_entity} aggregates per entity: the server grew {grown / entities:.0f} bytes"
            f" per entity, the budget counts {counted / entities:.0f}"
        )
    finally:
        await proc.stop()


async def test_the_room_a_purge_makes_is_not_given_twice(database: Database) -> None:
    """A purge empties an aggregate; a signal read before the purge took effect, in the
    batch after its own, counted that aggregate as held and adds it back. The room the
    purge made is that signal's, not a new write's: given to both, the aggregates went
    past the budget (the fault-history checker saw up to 3.5 KiB)."""
    held = 2 * TALLY_BYTES + ENTITY_BYTES  # "x": its ledger and community "a"
    srv = Server(Config(host="127.0.0.1", port=0, db=database.target,
                        memory_budget=str(held + TALLY_BYTES // 2)))  # fmt: skip
    await srv.start()
    purged, readd = asyncio.Event(), asyncio.Event()  # released: the purge's commit, the next
    holding: list[asyncio.Event] = [asyncio.Event(), asyncio.Event()]

    async def gate(real: Callable[[Batch], Awaitable[None]], batch: Batch) -> None:
        if batch.past and not purged.is_set():
            holding[0].set()
            await purged.wait()
        elif batch.signals and purged.is_set() and not readd.is_set():
            holding[1].set()
            await readd.wait()
        await real(batch)

    try:
        async with await Client.connect(*srv.address) as c:
            await c.signal(1, "x", "v", communities=["a"])  # only user 1 counts in "x"/"a"
            assert (await c.stats())["aggregates_bytes"] == held
            wrap_commit(srv, gate)
            purge = asyncio.ensure_future(c.purge(1))
            await holding[0].wait()
            # read while the purge's batch is on its way: "x"/"a" is held, so it creates nothing
            again = asyncio.ensure_future(c.signal(2, "x", "v", communities=["a"]))
            purged.set()
            await holding[1].wait()  # the purge took "x"/"a" off; the signal's batch is held
            assert (await purge).signals == 1
            wants = asyncio.ensure_future(c.signal(3, "x", "v", communities=["b"]))
            readd.set()
            with pytest.raises(Unavailable, match="full: "):
                await wants  # a new aggregate, in the room the signal before it takes back
            assert (await again).forwarded
            stats = await c.stats()
            assert stats["aggregates_bytes"] == held <= stats["memory_budget"]
            counts = await c.counts("x")
            assert counts.communities["a"]["v"].count == 1 and "b" not in counts.communities
    finally:
        purged.set()
        readd.set()
        await srv.shutdown()


async def test_silent_connections_pipelining_big_reads_stay_within_the_budget(
    database: Database,
) -> None:
    """The fifth round of hostile input: 5,000 Left users, and 12 connections that each
    pipeline 64 pages of them and never read. Every page waited for the same commit and
    was built at once: RSS grew by 290 MB under an 8 MiB budget, and kept 220 MB after the
    connections closed. Now a page holds its room in the budget until it is written out,
    and a connection's unread replies count against its --max-output-buffer: the server
    grows by less than the budget and the allowances, a bystander is served, and a silent
    connection that starts reading gets every answer."""
    allowance = 1 << 20
    budget = 8 << 20
    proc = ServerProcess(
        database.target, "--memory-budget", "8M", "--max-output-buffer", str(allowance)
    )
    await proc.start()
    assert proc.proc is not None
    silent: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        async with await proc.connect() as client:
            for first in range(1, 5001, 500):
                await asyncio.gather(*(client.leave(u) for u in range(first, first + 500)))
            assert await client.count_left() == 5000
            before = rss_kib(proc.proc.pid) * 1024
            pages = b"".join(msgpack.packb([0, i, "left_users", [None, 10_000]]) for i in range(64))
            for _ in range(12):
                reader, writer = await asyncio.open_connection("127.0.0.1", proc.port)
                writer.write(pages)
                await writer.drain()
                silent.append((reader, writer))
            peak = 0
            for _ in range(20):  # a bystander, served meanwhile, and the server's size
                page = await client.left_users(None, 10_000)
                assert len(page.users) == 5000
                peak = max(peak, rss_kib(proc.proc.pid) * 1024 - before)
            most = budget + 12 * allowance
            assert peak <= most, f"grew {peak / 2**20:.1f} MiB, past {most / 2**20:.0f} MiB"
            reader, writer = silent[0]  # one starts reading: every page comes
            unpacker = msgpack.Unpacker()
            answered: list[Any] = []
            while len(answered) < 64:
                data = await asyncio.wait_for(reader.read(1 << 20), 30)
                assert data, "the server closed a connection that had not read yet"
                unpacker.feed(data)
                answered += list(unpacker)
            assert sorted(a[1] for a in answered) == list(range(64))
            assert all(len(a[3]["users"]) == 5000 for a in answered)
            for _, writer in silent:
                writer.transport.abort()
            # what the closed connections held is given back: a read answers from where it was
            page = await client.left_users(None, 10_000)
            after = rss_kib(proc.proc.pid) * 1024 - before
            assert after <= most, f"kept {after / 2**20:.1f} MiB after the connections closed"
    finally:
        for _, writer in silent:
            writer.close()
        await proc.stop()

"""Ranked and windowed reads: top by count, weight and trend, windows by event time, and every
leave and purge honoured, over real sockets on both backends."""

from __future__ import annotations

import asyncio
import json
import math
import shlex
import subprocess
import sys
import time
from typing import Any

import pytest

from tidal.client import Client, InvalidParams, Signal, Tally
from tidal.server import Config, Server

from .conftest import Database, ServerProcess
from .rawrpc import RawPeer

pytestmark = pytest.mark.both_backends
MIN, HOUR, DAY = 60 * 10**9, 3600 * 10**9, 86400 * 10**9


def ago(ns: int) -> int:
    return time.time_ns() - ns


@pytest.mark.through_cluster
async def test_windows_count_by_event_time(client: Client) -> None:
    """Each signal counts in the windows its event time falls in, late ones included."""
    for at, n in ((ago(0), 1), (ago(2 * HOUR), 2), (ago(3 * DAY), 4), (ago(20 * DAY), 8),
                  (ago(40 * DAY), 16)):  # fmt: skip
        for _ in range(n):
            await client.signal(1, "song", "view", 0.5, communities=["jazz"], at_ns=at)
    await client.signal(2, "song", "view")  # no at_ns: when the server read it
    expected = {"1h": 2, "24h": 4, "7d": 8, "30d": 16, None: 32}
    for window, count in expected.items():
        counts = await client.counts("song", window=window)
        assert counts.ledger["view"].count == count, window
        jazz = count - 1
        assert counts.communities["jazz"]["view"] == Tally(jazz, jazz * 0.5), window
    # an entity with nothing in a window has no aggregates there
    await client.signal(1, "old", "view", at_ns=ago(10 * DAY))
    assert (await client.counts("old", window="7d")).ledger == {}
    assert (await client.counts("old", window="30d")).ledger["view"].count == 1


@pytest.mark.through_cluster
async def test_top_orders_by_score_then_entity_and_pages_without_gaps(client: Client) -> None:
    signals = []
    for i in range(40):
        entity = f"e{i:02d}"
        for _ in range(i % 7 + 1):  # ties: entities with the same count order by name
            signals.append(Signal(i, entity, "view", float(40 - i), ["jazz"]))
    await client.signal_batch(signals)
    whole = await client.top("community", "jazz", "view", limit=1000)
    assert whole.next is None
    ranked = [(r.entity, r.count) for r in whole.entities]
    assert ranked == sorted(ranked, key=lambda e: (-e[1], e[0].encode()))
    assert len(ranked) == 40
    paged: list[str] = []
    page = await client.top("community", "jazz", "view", limit=7)
    while True:
        paged += [r.entity for r in page.entities]
        if page.next is None:
            break
        page = await client.top("community", "jazz", "view", limit=7, after=page.next)
    assert paged == [e for e, _ in ranked]  # no duplicate, no gap
    by_weight = await client.top("community", "jazz", "view", by="weight", limit=3)
    # e00 has 1 signal of weight 40; e06: 7 of 34; e05: 6 of 35; e13: 7 of 27
    assert [(r.entity, r.score) for r in by_weight.entities] == [
        ("e06", 238.0), ("e05", 210.0), ("e13", 189.0)
    ]  # fmt: skip
    assert (await client.top("community", "jazz", "view", limit=150)).entities == whole.entities
    assert (await client.top("community", "nobody", "view")).entities == []


@pytest.mark.through_cluster
async def test_trend_decays_each_signal_by_its_age(client: Client) -> None:
    """Many old signals lose to a few fresh ones by trend, and win by count."""
    await client.signal_batch(
        [Signal(1, "old", "view", 1.0, ["jazz"], at_ns=ago(2 * DAY)) for _ in range(50)]
    )
    fresh = ago(0)
    await client.signal_batch([Signal(2, "new", "view", 2.0, ["jazz"], at_ns=fresh)] * 3)
    by_count = await client.top("community", "jazz", "view")
    assert [r.entity for r in by_count.entities] == ["old", "new"]
    trend = await client.top("community", "jazz", "view", by="trend", half_life="6h")
    assert [r.entity for r in trend.entities] == ["new", "old"]
    new = trend.entities[0]
    assert (new.count, new.weight) == (3, 6.0)
    want = 6.0 * 2 ** (-(trend.as_of_ns - fresh) / (6 * 3600e9))
    assert math.isclose(new.score, want, rel_tol=1e-9)


@pytest.mark.through_cluster
async def test_a_left_user_reaches_the_ledger_ranking_only(client: Client) -> None:
    await client.define_cohort("gold", {"tier": "gold"})
    await client.leave(7)
    for _ in range(3):
        await client.signal(7, "song", "view", communities=["jazz"], attrs={"tier": "gold"})
    await client.signal(8, "other", "view", communities=["jazz"], attrs={"tier": "gold"})
    for layer, name in (("community", "jazz"), ("cohort", "gold")):
        for window in (None, "1h"):
            top = await client.top(layer, name, "view", window=window)
            assert [r.entity for r in top.entities] == ["other"], (layer, window)
    ledger = await client.top("ledger", None, "view")
    assert [(r.entity, r.count) for r in ledger.entities] == [("song", 3), ("other", 1)]
    assert (await client.counts("song", window="1h")).communities == {}


async def test_purge_and_erase_take_a_user_s_past_out_of_every_ranking(
    database: Database,
) -> None:
    """A checkpoint every 3 signals puts the user's rows on both sides of the watermark;
    the rankings after a purge, an erase and a restart equal those of the others alone."""
    config = Config(port=0, db=database.target, checkpoint_signals=3)
    server = Server(config)
    await server.start()
    async with await Client.connect(*server.address) as c:
        for day in range(5):
            for user, entity in ((1, "a"), (2, "b"), (3, "a"), (1, "c")):
                await c.signal(user, entity, "view", 1.0, communities=["jazz"],
                               at_ns=ago(day * DAY + 5 * MIN))  # fmt: skip
        assert (await c.purge(1)).signals == 10
        assert (await c.erase(3)).signals == 5
        await check_only_user_2(c)
    await server.shutdown()
    server = Server(config)
    await server.start()
    async with await Client.connect(*server.address) as c:
        await check_only_user_2(c)
    await server.shutdown()


async def check_only_user_2(c: Client) -> None:
    for window, n in ((None, 5), ("1h", 1), ("24h", 1), ("7d", 5)):
        top = await c.top("community", "jazz", "view", window=window)
        assert [(r.entity, r.count) for r in top.entities] == [("b", n)], window
    ledger = await c.top("ledger", None, "view", window="7d")  # the purge leaves the ledger
    assert [(r.entity, r.count) for r in ledger.entities] == [("a", 5), ("b", 5), ("c", 5)]
    trend = await c.top("community", "jazz", "view", by="trend")
    assert [r.entity for r in trend.entities] == ["b"]
    assert (await c.counts("a", window="30d")).communities == {}


async def test_a_read_after_a_purge_never_shows_it_from_any_connection(
    database: Database,
) -> None:
    """Pipelined [status, top, status] and [status, counts in a window, status] from
    another connection, around a pipelined [signal, leave+purge]: a read after the
    status that says Left never counts the user's past."""
    server = Server(Config(port=0, db=database.target, checkpoint_signals=2))
    await server.start()
    try:
        async with await Client.connect(*server.address) as c:
            for _ in range(3):
                await c.signal(1, "song", "view", communities=["x"])
                await c.signal(2, "song", "view", communities=["x"])
        writer, reader = await RawPeer.open(server.address), await RawPeer.open(server.address)
        reads: list[Any] = [
            ["top", ["community", "x", "view", {}]],
            ["top", ["community", "x", "view", {"window": "1h"}]],
            ["counts", ["song", {"window": "24h"}]],
        ]
        triples = 240

        def send(i: int) -> None:
            method, params = reads[i % len(reads)]
            reader.send([0, 3 * i, "status", [1]])
            reader.send([0, 3 * i + 1, method, params])
            reader.send([0, 3 * i + 2, "status", [1]])

        for i in range(triples // 2):
            send(i)
        writer.send([0, 1, "signal", [1, "song", "view", 1.0, {"communities": ["x"]}]])
        writer.send([0, 2, "leave", [1, {"purge": True}]])
        # the second half once the server has read the leave (status says so at once, from
        # memory), so that some reads come after it whichever socket it reads first
        replies: dict[int, Any] = {}
        poll = 3 * triples
        while not replies or replies[poll - 1]["status"] != "left":
            reader.send([0, poll, "status", [1]])
            while poll not in replies:
                reply = await reader.receive()
                replies[reply[1]] = reply[3]
            poll += 1
        for i in range(triples // 2, triples):
            send(i)
        mine = {r[1]: r for r in [await writer.receive() for _ in range(2)]}
        assert mine[2][3]["purged"] == 4
        while any(k not in replies for k in range(3 * triples)):
            reply = await reader.receive()
            replies[reply[1]] = reply[3]
        judged = set()
        for i in range(triples):
            before, read, after = (replies[3 * i + k] for k in range(3))
            if "entities" in read:
                x = read["entities"][0]["count"]
            else:
                x = read["communities"]["x"]["view"]["count"]
            if before["status"] == "left":
                assert x == 3, (i, x)
                judged.add("left")
            if after["status"] == "active":
                assert x in (6, 7), (i, x)
                judged.add("active")
        assert judged == {"left", "active"}, judged
        writer.close()
        reader.close()
    finally:
        await server.shutdown()


async def test_rankings_survive_kill_9(process: ServerProcess) -> None:
    await process.start()
    c = await process.connect()
    for i in range(30):
        await c.signal(i % 4, f"e{i % 5}", "view", float(i), communities=["jazz"],
                       at_ns=ago((i % 3) * DAY))  # fmt: skip
    await c.purge(1)
    before = [await c.top("community", "jazz", "view", window=w) for w in (None, "1h", "7d")]
    trend = await c.top("community", "jazz", "view", by="trend")
    await c.close()
    await process.kill9()
    await process.start()
    c = await process.connect()
    after = [await c.top("community", "jazz", "view", window=w) for w in (None, "1h", "7d")]
    assert [t.entities for t in after] == [t.entities for t in before]
    again = await c.top("community", "jazz", "view", by="trend")
    assert [r.entity for r in again.entities] == [r.entity for r in trend.entities]
    for old, new in zip(trend.entities, again.entities, strict=True):
        decayed = old.score * 2 ** (-(again.as_of_ns - trend.as_of_ns) / (6 * 3600e9))
        assert math.isclose(new.score, decayed, rel_tol=1e-9)
    await c.close()


async def test_retention_keeps_deleted_rows_counting_in_windows(database: Database) -> None:
    """Rows retention deleted keep counting, in every window and ranking, as all-time
    counts do: their buckets were checkpointed before the rows could go."""
    now = [1_700_000_000 * 10**9]
    server = Server(Config(port=0, db=database.target, checkpoint_signals=2),
                    clock=lambda: now[0])  # fmt: skip
    await server.start()
    async with await Client.connect(*server.address) as c:
        for _ in range(4):
            await c.signal(1, "song", "view", communities=["jazz"], at_ns=now[0] - DAY)
        await c.signal(1, "tune", "view", communities=["jazz"])
    await server.shutdown()
    now[0] += 2 * DAY
    server = Server(Config(port=0, db=database.target, ledger_retention=86_400),
                    clock=lambda: now[0])  # fmt: skip
    await server.start()
    try:
        await asyncio.wait_for(server.engine.retention.caught_up.wait(), 10)
        async with await Client.connect(*server.address) as c:
            assert (await c.stats())["ledger_rows"] == 0
            for window in ("7d", "30d", None):
                top = await c.top("community", "jazz", "view", window=window)
                assert [(r.entity, r.count) for r in top.entities] == [("song", 4), ("tune", 1)]
            assert (await c.top("community", "jazz", "view", window="24h")).entities == []
            assert (await c.counts("song", window="7d")).ledger["view"].count == 4
    finally:
        await server.shutdown()


BAD_TOP = [
    (["galaxy", "x", "view"], "layer: must be 'ledger', 'cohort' or 'community'"),
    ([["ledger"], None, "view", {}], "layer: must be 'ledger', 'cohort' or 'community'"),
    ([{"ledger": 1}, None, "view"], "layer: must be 'ledger', 'cohort' or 'community'"),
    (["community", "x", "view", {"by": ["count"]}], "options.by: must be"),
    (["community", "x", "view", {"window": ["1h"]}], "options.window: must be one of"),
    (["ledger", "x", "view"], "name: must be nil for the ledger layer"),
    (["cohort", "nope", "view"], "name: no cohort named 'nope'"),
    (["community", "x", ""], "kind"),
    (["community", "x", "view", {"by": "loudness"}], "options.by: must be"),
    (["community", "x", "view", {"window": "2h"}], "options.window: must be one of"),
    (["community", "x", "view", {"by": "trend", "window": "1h"}], "options.window: not with"),
    (["community", "x", "view", {"by": "trend", "half_life": "2h"}], "options.half_life"),
    (["community", "x", "view", {"half_life": "6h"}], "options.half_life: only with"),
    # another script's digits are not 6h (int() and isdigit() would take them)
    (["community", "x", "view", {"by": "trend", "half_life": "\u0666h"}], "options.half_life"),
    (["community", "x", "view", {"by": "trend", "half_life": "\uff16h"}], "options.half_life"),
    (["community", "x", "view", {"limit": 0}], "options.limit: must be an integer in 1..1000"),
    (["community", "x", "view", {"limit": 1001}], "options.limit"),
    (["community", "x", "view", {"after": b"junk"}], "options.after: must be the 'next'"),
    (["community", "x", "view", {"after": "text"}], "options.after"),
    (["community", "x", "view", {"colour": 1}], "options: unknown key 'colour'"),
    (["community", "x", "view", []], "options: must be a map"),
]


@pytest.mark.parametrize(("params", "message"), BAD_TOP)
async def test_a_bad_top_gets_an_error_naming_what(
    client: Client, params: list[Any], message: str
) -> None:
    with pytest.raises(InvalidParams, match=message.replace("(", r"\(").replace("..", r"\.\.")):
        await client.call("top", *params)


@pytest.mark.through_cluster
async def test_a_cursor_of_another_ranking_is_refused(client: Client) -> None:
    await client.signal_batch([Signal(i, f"e{i}", "view", 1.0, ["x"]) for i in range(3)])
    page = await client.top("community", "x", "view", limit=1)
    assert page.next is not None
    with pytest.raises(InvalidParams, match=r"options\.after"):
        await client.top("community", "x", "view", by="weight", limit=1, after=page.next)


@pytest.mark.through_cluster
async def test_event_times_are_checked(client: Client) -> None:
    for bad, rule in ((-1, "0..2"), (1.5, "integer"), ("now", "integer"), (2**63, "0..2"),
                      (time.time_ns() + 10 * MIN, "ahead of the server's clock")):  # fmt: skip
        with pytest.raises(InvalidParams, match=r"context\.at_ns: .*" + rule.replace(".", r"\.")):
            await client.call("signal", 1, "e", "view", 1.0, {"at_ns": bad})
    ahead = Signal(1, "e", "view", at_ns=time.time_ns() + HOUR)
    with pytest.raises(InvalidParams, match=r"signals\[1\]\.context\.at_ns"):
        await client.signal_batch([Signal(1, "e", "view"), ahead])
    assert (await client.stats())["signals"] == 0  # nothing of either was applied
    await client.signal(1, "e", "view", at_ns=time.time_ns() + MIN)  # a clock a bit ahead
    with pytest.raises(InvalidParams, match=r"page\.window: must be one of"):
        await client.counts("e", window="1y")
    # 1d is 24h, wherever a window is taken
    assert await client.counts("e", window="1d") == await client.counts("e", window="24h")
    day = await client.top("ledger", None, "view", window="1d")
    assert day.entities == (await client.top("ledger", None, "view", window="24h")).entities


def tidal_top(port: int, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidal.cli", "top", "--port", str(port), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_tidal_top_prints_a_table_and_json(process: ServerProcess) -> None:
    await process.start()
    async with await process.connect() as c:
        await c.signal_batch(
            [Signal(i, "song-a", "view", 1.0, ["jazz"]) for i in range(3)]
            + [Signal(9, "song-b", "view", 2.5, ["jazz"])]
        )
    done = await asyncio.to_thread(tidal_top, process.port, "community", "jazz", "view")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["rank", "entity", "count", "weight", "score"]
    assert lines[1].split() == ["1", "song-a", "3", "3", "3"]
    assert lines[2].split() == ["2", "song-b", "1", "2.5", "1"]
    args = ("ledger", "view", "--by", "weight", "--window", "1h", "--limit", "1", "--json")
    done = await asyncio.to_thread(tidal_top, process.port, *args)
    reply = json.loads(done.stdout)
    assert [e["entity"] for e in reply["entities"]] == ["song-a"] and reply["next"]
    # the next page, from the cursor --json printed
    done = await asyncio.to_thread(tidal_top, process.port, *args, "--after", reply["next"])
    assert [e["entity"] for e in json.loads(done.stdout)["entities"]] == ["song-b"], done.stderr
    # the table prints the command for the next page; its ranks go on from the first page's
    done = await asyncio.to_thread(tidal_top, process.port, "ledger", "view", "--limit", "1")
    *_, said, command = done.stdout.splitlines()
    assert said.endswith("more after these:"), done.stdout
    argv = shlex.split(command)
    assert argv[0] == "tidal" and argv[-2] == "--after", command
    pasted = [sys.executable, "-m", "tidal.cli", *argv[1:]]  # as a person pastes it
    done = await asyncio.to_thread(subprocess.run, pasted, capture_output=True, text=True)
    assert done.stdout.splitlines()[1].split() == ["2", "song-b", "1", "2.5", "1"], done.stdout
    assert "more after these" not in done.stdout
    done = await asyncio.to_thread(tidal_top, process.port, "ledger", "view", "--window", "1d")
    assert done.stdout.splitlines()[1].split() == ["1", "song-a", "3", "3", "3"], done.stderr
    done = await asyncio.to_thread(tidal_top, process.port, "community", "nojazz", "view")
    assert done.returncode == 0
    assert "nothing counted in community 'nojazz' under kind 'view'" in done.stdout
    done = await asyncio.to_thread(tidal_top, process.port, "cohort", "nope", "view")
    assert done.returncode == 1 and "no cohort named 'nope'" in done.stderr
    done = await asyncio.to_thread(tidal_top, process.port, "ledger", "x", "view")
    assert done.returncode == 2 and "takes no name" in done.stderr


async def test_a_boot_long_after_moves_the_trend_base_and_keeps_the_scores(
    database: Database,
) -> None:
    """Sums grow as 2**(age of the base / half-life): a boot 200 half-lives on moves the
    base, scaling every sum by an exact power of two, and the scores stay what they are."""
    now = [1_700_000_000 * 10**9]
    config = Config(port=0, db=database.target, trend_half_lives="1h")
    for step in range(3):
        server = Server(config, clock=lambda: now[0])
        await server.start()
        async with await Client.connect(*server.address) as c:
            await c.signal(1, f"song{step}", "view", 2.0, communities=["jazz"])
            top = await c.top("community", "jazz", "view", by="trend")
            assert len(top.entities) == step + 1
            for r in top.entities:
                age_h = (step - int(r.entity[-1])) * 200
                assert math.isclose(r.score, 2.0 * 2.0**-age_h, rel_tol=1e-9), (r, age_h)
        await server.shutdown()
        now[0] += 200 * HOUR

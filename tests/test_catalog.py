"""``catalog``: what is stored, listed without knowing a name (the kinds, the cohorts, the
communities), each with its aggregates and the signals they count, a page at a time, as
Redis's SCAN or Kafka's topic list let a newcomer look around."""

from __future__ import annotations

import asyncio
import shlex
import subprocess
import sys
from typing import Any

import pytest

from tidal.client import InvalidParams, Signal

from .conftest import ServerProcess


@pytest.mark.through_cluster
async def test_the_catalog_lists_every_name_once_with_what_it_counts(client: Any) -> None:
    await client.define_cohort("de", {"country": "DE"})
    await client.define_cohort("none-yet", {"country": "XX"})
    de = {"country": "DE"}
    await client.signal_batch(
        [Signal(u, f"song-{u % 3}", "view", communities=["jazz", f"c{u:02}"], attrs=de)
         for u in range(12)]
        + [Signal(99, "song-0", "like", communities=["jazz"])]
    )  # fmt: skip
    await client.leave(50)
    await client.signal(50, "song-9", "view", communities=["gated"])  # the ledger only

    kinds = await client.catalog("ledger")
    assert [(i.name, i.aggregates, i.count) for i in kinds.items] == [
        ("like", 1, 1),
        ("view", 4, 13),
    ] and kinds.next is None
    cohorts = await client.catalog("cohort")
    assert [(i.name, i.aggregates, i.count) for i in cohorts.items] == [
        ("de", 3, 12),
        ("none-yet", 0, 0),  # defined, nothing counted yet
    ]
    seen: list[tuple[str, int, int]] = []  # pages of 5: every community once, in order
    after = None
    while True:
        page = await client.catalog("community", after=after, limit=5)
        seen += [(i.name, i.aggregates, i.count) for i in page.items]
        if page.next is None:
            break
        after = page.next
    assert seen == [(f"c{u:02}", 1, 1) for u in range(12)] + [("jazz", 4, 13)]
    assert "gated" not in [name for name, _, _ in seen]
    await client.purge(0)  # user 0's past leaves jazz and c00
    jazz = (await client.catalog("community", after="c11")).items
    assert [(i.name, i.count) for i in jazz] == [("jazz", 12)]


@pytest.mark.parametrize(
    ("params", "named"),
    [
        (["galaxy"], "layer: must be 'ledger', 'cohort' or 'community'"),
        (["community", {"limit": 0}], "page.limit: must be an integer in 1..1000"),
        (["community", {"after": ""}], "page.after"),
        (["community", {"colour": 1}], "page: unknown key 'colour'"),
    ],
)
async def test_a_bad_catalog_request_names_what(client: Any, params: list[Any], named: str) -> None:
    with pytest.raises(InvalidParams, match=named.replace("(", r"\(").replace("..", r"\.\.")):
        await client.call("catalog", *params)


async def test_tidal_catalog_prints_a_table_and_the_next_page(process: ServerProcess) -> None:
    await process.start()
    async with await process.connect() as c:
        await c.signal_batch([Signal(u, "s", "view", communities=[f"c{u}"]) for u in range(3)])

    def tidal(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "tidal.cli", *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)

    done = await asyncio.to_thread(tidal, "catalog", "-p", str(process.port), "--limit", "2")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["community", "aggregates", "signals"]
    assert [line.split() for line in lines[1:3]] == [["c0", "1", "1"], ["c1", "1", "1"]]
    command = shlex.split(lines[-1])
    assert command[:2] == ["tidal", "catalog"] and command[-2:] == ["--after", "c1"]
    done = await asyncio.to_thread(tidal, *command[1:])
    assert [line.split() for line in done.stdout.splitlines()[1:]] == [["c2", "1", "1"]]

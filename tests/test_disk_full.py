"""A real full disk: the database on a small tmpfs that the test fills up."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidal.client import Client, Unavailable
from tidal.server import Config, Server

from .conftest import tmpfs


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "disk", "3m") as mount:
        yield mount


def fill(disk: Path, leave: int) -> Path:
    """A file that takes all the space but ``leave`` bytes."""
    stat = os.statvfs(disk)
    free = stat.f_bavail * stat.f_frsize
    filler = disk / "filler"
    with filler.open("wb") as f:
        f.write(b"\0" * max(0, free - leave))
    return filler


async def test_a_full_disk_refuses_writes_serves_reads_and_recovers(small_disk: Path) -> None:
    db = small_disk / "tidal.db"
    server = Server(Config(port=0, db=str(db)))
    await server.start()
    acked: list[int] = []
    try:
        async with (
            await Client.connect(*server.address) as c,
            await Client.connect(*server.address) as other,
        ):
            await c.leave(1)
            filler = fill(small_disk, leave=64 * 1024)
            refused = None
            for i in range(5_000):
                try:
                    ack = await c.signal(i, "e", "view", attrs={"pad": "x" * 200})
                except Unavailable as exc:
                    refused = exc
                    break
                acked.append(ack.seq)
            assert refused is not None, "the disk never filled up"
            assert "full" in str(refused), refused
            # refused writes stay refused and leave no trace; reads and others still work
            with pytest.raises(Unavailable):
                await other.rejoin(1)
            assert (await other.status(1)).status == "left"
            assert (await c.counts("e")).ledger["view"].count == len(acked)
            assert await other.ping() == "pong"
            # health says so, and keeps saying so while the disk stays full
            for _ in range(2):
                health = await other.health()
                assert health["status"] == "failing" and health["storage"] == "full", health
            # space comes back: health finds out with a write of its own, writes resume
            filler.unlink()
            assert (await other.health())["status"] == "ok"
            assert (await c.rejoin(1)).status == "active"
            after = await c.signal(10_000, "e", "view")
            acked.append(after.seq)
            assert (await c.counts("e")).ledger["view"].count == len(acked)
    finally:
        await server.shutdown()
    server = Server(Config(port=0, db=str(db)))
    await server.start()
    try:
        async with await Client.connect(*server.address) as c:
            assert (await c.counts("e")).ledger["view"].count == len(acked)
            assert (await c.status(1)).status == "active"
    finally:
        await server.shutdown()

"""Damaged files at boot: tidal boots on a clean database or refuses, saying why."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from tidal.client import Tally

from .conftest import ServerProcess


async def write_some(process: ServerProcess, n: int = 300) -> None:
    async with await process.connect() as c:
        for i in range(n):
            await c.signal(i, f"e{i % 7}", "view", communities=["c"])
            if i % 10 == 0:
                await c.leave(i)


def overwrite(path: Path, offset: int, data: bytes) -> None:
    with path.open("r+b") as f:
        f.seek(offset)
        f.write(data)


def page_size_and_root(db: Path, table: str) -> tuple[int, int]:
    with sqlite3.connect(db) as conn:
        (page_size,) = conn.execute("PRAGMA page_size").fetchone()
        (root,) = conn.execute(
            "SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)
        ).fetchone()
    return page_size, root


async def test_flipped_bytes_in_a_table_stop_the_boot(process: ServerProcess) -> None:
    await process.start()
    await write_some(process)
    assert await process.stop() == 0  # clean: everything is in the main file
    page_size, root = page_size_and_root(process.file, "ledger")
    overwrite(process.file, (root - 1) * page_size, b"\xff" * 64)  # the root page's header
    with pytest.raises(AssertionError, match=r"integrity check|malformed"):
        await process.start()
    assert process.proc is not None and process.proc.returncode == 2
    assert b"will not serve a damaged database" in b"".join(process.log)


async def test_a_file_that_is_not_a_database_stops_the_boot(process: ServerProcess) -> None:
    process.file.write_bytes(b"this is not SQLite at all" * 100)
    with pytest.raises(AssertionError, match="not a database"):
        await process.start()
    assert process.proc is not None and process.proc.returncode == 2


async def test_a_truncated_wal_boots_on_what_it_holds_intact(process: ServerProcess) -> None:
    await process.start()
    await write_some(process, 200)
    await process.kill9()  # the last commits are still only in the WAL
    wal = process.file.with_name(process.file.name + "-wal")
    size = wal.stat().st_size
    assert size > 0, "expected a WAL after kill -9"
    os.truncate(wal, size - size // 3 - 17)  # cut through the middle of a frame
    await process.start()
    async with await process.connect() as c:
        total = 0
        for i in range(7):
            total += (await c.counts(f"e{i}")).ledger.get("view", Tally(0, 0)).count
        assert 0 <= total <= 200
        await c.signal(1, "e0", "view")  # and it takes writes again
    assert await process.stop() == 0
    with sqlite3.connect(process.file) as conn:
        assert conn.execute("PRAGMA quick_check").fetchone() == ("ok",)
        (rows,) = conn.execute("SELECT COUNT(*) FROM ledger").fetchone()
        assert rows == total + 1

"""Online backup under write load, restored, holds every write acknowledged before it began."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tidal.client import Client
from tidal.server import Config, Server
from tidal.server.errors import BackupFailed
from tidal.server.storage.sqlite.backup import backup
from tidal.server.storage.sqlite.sqlite_storage import SqliteStorage

from .conftest import ServerProcess


class Milestone:
    """Set once a count passes ``at``."""

    def __init__(self, at: int) -> None:
        self.move(at)

    def move(self, at: int) -> None:
        self.at, self.reached = at, asyncio.Event()

    def passed(self, count: int) -> None:
        if count >= self.at:
            self.reached.set()


async def test_a_backup_under_load_restores_every_earlier_acknowledgement(
    db_path: Path, tmp_path: Path
) -> None:
    server = Server(Config(port=0, db=str(db_path), checkpoint_signals=500))
    await server.start()
    acked: dict[int, int] = {}  # seq -> user
    left: set[int] = set()
    stop = asyncio.Event()
    milestone = Milestone(1000)

    async def load(c: Client, n: int) -> None:
        i = 0
        while not stop.is_set():
            user = n * 100_000 + i
            acked[(await c.signal(user, "e", "view", communities=["c"])).seq] = user
            milestone.passed(len(acked))
            if i % 10 == 0:
                await c.leave(user)
                left.add(user)
            i += 1

    try:
        clients = [await Client.connect(*server.address) for _ in range(3)]
        writers = [asyncio.create_task(load(c, n)) for n, c in enumerate(clients)]
        await milestone.reached.wait()
        before = dict(acked)
        left_before = set(left)
        dest = tmp_path / "backup.db"
        info = await asyncio.to_thread(backup, db_path, dest)  # the server keeps writing
        milestone.move(len(acked) + 100)  # and the load goes on after it
        await milestone.reached.wait()
        stop.set()
        await asyncio.gather(*writers)
        for c in clients:
            await c.close()
    finally:
        await server.shutdown()
    assert info.ledger_rows >= len(before)
    assert len(acked) > len(before), "the load did not go on during the backup"
    restored = Server(Config(port=0, db=str(dest)))
    await restored.start()
    try:
        async with await Client.connect(*restored.address) as c:
            for user in left_before:
                assert (await c.status(user)).status == "left"
            counts = await c.counts("e")
            assert counts.ledger["view"].count == info.ledger_rows
            # every signal's user left only after it: none of them was gated
            assert counts.communities["c"]["view"].count == info.ledger_rows
    finally:
        await restored.shutdown()
    with sqlite3.connect(dest) as db:
        rows = dict(db.execute("SELECT seq, user_id FROM ledger"))
    assert all(rows.get(seq) == user for seq, user in before.items())


def test_backup_never_overwrites_and_says_why(db_path: Path, tmp_path: Path) -> None:
    sqlite3.connect(db_path).close()
    taken = tmp_path / "taken.db"
    taken.write_bytes(b"keep me")
    done = subprocess.run(
        [sys.executable, "-m", "tidal.cli", "backup", str(taken), "--db", str(db_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and "never overwrites" in done.stderr
    assert taken.read_bytes() == b"keep me"
    with pytest.raises(BackupFailed, match="no database at"):
        backup(tmp_path / "missing.db", tmp_path / "new.db")


async def test_status_and_stats_read_well(process: ServerProcess, tmp_path: Path) -> None:
    await process.start()
    async with await process.connect() as c:
        await c.leave(42)
        await c.signal(1, "e", "view")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tidal.cli", *args, "--port", str(process.port)],
            capture_output=True,
            text=True,
            check=False,
        )

    status = await asyncio.to_thread(cli, "status", "42")
    assert status.returncode == 0
    assert status.stdout.startswith("user 42: left, left at 20") and " ns)" in status.stdout
    never = await asyncio.to_thread(cli, "status", "7")
    assert never.stdout.strip() == "user 7: active, never left"
    stats = await asyncio.to_thread(cli, "stats")
    lines = dict(line.split(None, 1) for line in stats.stdout.strip().splitlines())
    assert lines["signals"] == "1" and lines["users_left"] == "1"
    backup_out = tmp_path / "cli-backup.db"
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "tidal.cli", "backup", str(backup_out), "--db", str(process.db)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0 and "backed up 1 ledger rows and 1 leave records" in done.stdout


def test_a_backup_keeps_what_it_did_not_make(db_path: Path, tmp_path: Path) -> None:
    """A backup wrote through a fixed DEST.partial: it deleted a file of the user's of that
    name, and a failed one left its own behind."""

    async def made_by_tidal() -> None:
        await (await SqliteStorage.open(db_path)).close()

    asyncio.run(made_by_tidal())
    mine = tmp_path / "copy.db.partial"
    mine.write_bytes(b"the user's own")
    not_a_database = tmp_path / "junk.db"
    not_a_database.write_bytes(b"this is not a database" * 100)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(BackupFailed):
        backup(not_a_database, tmp_path / "copy.db")
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing left behind
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tidal.cli",
            "backup",
            str(tmp_path / "copy.db"),
            "--db",
            str(db_path),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert mine.read_bytes() == b"the user's own"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*before, "copy.db"])

"""Online backup: a consistent copy of the database, taken while the server keeps writing.

SQLite's backup API, done in one step, reads everything inside one read
transaction: the copy holds exactly what was committed when it began, and the
server's writer (WAL mode) carries on meanwhile. It is a local command on the
database file, not an RPC: no remote client can name a path on the server.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tidal.server.config import redact
from tidal.server.errors import BackupFailed
from tidal.server.storage.interface import is_url


@dataclass(frozen=True, slots=True)
class BackupInfo:
    dest: str
    seconds: float
    ledger_rows: int
    leave_records: int
    bytes: int


def backup(db: str | Path, dest: str | Path) -> BackupInfo:
    if is_url(str(db)):
        raise BackupFailed(
            f"{redact(str(db))} is a PostgreSQL database: back it up with PostgreSQL's own"
            f" tools, which copy it consistently while tidal writes: pg_dump --format=custom"
            f" --file {dest} DBNAME (or continuous archiving, or your service's snapshots)"
        )
    source, target = Path(db), Path(dest)
    if not source.is_file():
        raise BackupFailed(f"no database at {source}")
    if target.exists():
        raise BackupFailed(f"{target} exists; a backup never overwrites a file")
    if not target.parent.is_dir():
        raise BackupFailed(f"cannot write {target}: the directory {target.parent} does not exist")
    if not os.access(target.parent, os.W_OK):
        raise BackupFailed(f"cannot write {target}: {target.parent} is not writable for this user")
    try:
        return _copy(source, target)
    except (OSError, sqlite3.Error) as exc:
        raise BackupFailed(
            f"{source} to {target}: {getattr(exc, 'strerror', None) or exc}"
        ) from None


def _copy(source: Path, target: Path) -> BackupInfo:
    """Into a file of a unique name beside ``target``, made here and removed whatever
    happens: a fixed ``DEST.partial`` was left behind by a failed backup, and deleted, by
    the next one, a file of the user's that had that name."""
    began = time.perf_counter()
    made, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    os.close(made)
    partial = Path(name)
    try:
        src = sqlite3.connect(source)
        dst = sqlite3.connect(partial)
        try:
            src.backup(dst)  # all pages in one step: one snapshot
            dst.execute("PRAGMA journal_mode=DELETE")  # a single self-contained file
            if dst.execute("PRAGMA quick_check").fetchone() != ("ok",):
                raise BackupFailed(f"the copy of {source} failed its integrity check")
            ((ledger,),) = dst.execute("SELECT COUNT(*) FROM ledger")
            ((left,),) = dst.execute("SELECT COUNT(*) FROM memberships WHERE left = 1")
        finally:
            dst.close()
            src.close()
        with partial.open("rb") as f:
            os.fsync(f.fileno())
        # the backup appears whole or not at all, and never in place of a file that
        # appeared at DEST meanwhile (a link fails where a rename would overwrite)
        try:
            os.link(partial, target)
        except FileExistsError:
            raise BackupFailed(f"{target} exists; a backup never overwrites a file") from None
    finally:
        for made_here in (partial, partial.with_name(partial.name + "-journal")):
            made_here.unlink(missing_ok=True)
    directory = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return BackupInfo(str(target), time.perf_counter() - began, ledger, left, target.stat().st_size)

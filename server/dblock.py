"""One tidal per database: an OS lock on ``DB.lock``, held for the server's life.

Two servers on one file would each keep their own leave state in memory, so
a user who left through one would still be forwarded by the other. ``flock``
belongs to the open file: the kernel drops it when the process ends, however
it ends, so a kill -9 leaves no stale lock (the file stays, empty of meaning).
The holder writes its pid into the file, so a refused server can name it.
SQLite's own locks are POSIX record locks, which ``flock`` does not touch, so
``tidal backup`` still reads the database beside a running server.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from .errors import DatabaseInUse, DatabaseUnusable


class DatabaseLock:
    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, db: str | Path) -> DatabaseLock:
        """Take the lock before anything else touches the database, or say who holds it."""
        database = Path(os.path.realpath(db))  # one lock whatever path names the file
        path = database.with_name(database.name + ".lock")
        if database.is_dir():
            raise DatabaseUnusable(f"--db {db}: is a directory; name a file in it")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise DatabaseUnusable(unusable(db, database, exc)) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            os.close(fd)
            who = f"pid {holder}" if holder.isdigit() else "another process"
            raise DatabaseInUse(
                f"--db {db}: another tidal ({who}) already serves this database (it holds"
                f" {path}); stop it first, or give this one another --db"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(path, fd)

    def release(self) -> None:
        """Only after the database is closed: nothing may write once another can start."""
        if self._fd is not None:
            os.close(self._fd)  # closing drops the lock; the file may stay
            self._fd = None


def unusable(given: str | Path, database: Path, exc: OSError) -> str:
    """One line naming why a file next to ``database`` could not be created or written."""
    folder = database.parent
    if exc.errno == errno.ENOENT and not folder.is_dir():
        return f"--db {given}: the directory {folder} does not exist; create it first"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return (
            f"--db {given}: permission denied in {folder} for uid {os.getuid()};"
            " tidal needs to create and write files there"
        )
    if exc.errno == errno.EROFS:
        return f"--db {given}: {folder} is on a read-only file system; tidal needs to write there"
    return f"--db {given}: {exc.strerror or exc}"

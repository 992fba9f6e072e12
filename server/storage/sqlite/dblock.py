"""One tidal per database: an OS lock on the database file itself, held for the server's life.

Two servers on one file would each keep their own leave state in memory, so
a user who left through one would still be forwarded by the other. The lock is
taken on the file, not on a name beside it: ``flock`` locks the inode, so a hard
link, a bind mount, a symbolic link or any other path to the same file finds it
(a lock file named after the path would be a different file for each name). It
belongs to the open file: the kernel drops it when the process ends, however it
ends, so a kill -9 leaves no stale lock. SQLite's own locks are POSIX record
locks, which ``flock`` does not touch, so SQLite works beside it and ``tidal
backup`` still reads the database beside a running server. (POSIX locks are
dropped when a process closes *any* descriptor of their file, so this one is
closed only once SQLite has closed the database.)
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from tidal.server.errors import DatabaseInUse, DatabaseUnusable


class DatabaseLock:
    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, db: str | Path) -> DatabaseLock:
        """Take the lock before anything else touches the database, or say who holds it.
        A database that does not exist yet is created empty (SQLite takes an empty file
        for a new database), so that its lock exists before anything is written."""
        database = Path(os.path.realpath(db))
        try:
            is_dir = database.is_dir()  # a stat: refused in a directory that cannot be entered
        except OSError as exc:
            raise DatabaseUnusable(unusable(db, database, exc)) from None
        if is_dir:
            raise DatabaseUnusable(f"--db {db}: is a directory; name a file in it")
        try:
            fd = os.open(database, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            if not (exc.errno in (errno.EACCES, errno.EROFS) and database.is_file()):
                raise DatabaseUnusable(unusable(db, database, exc)) from None
            # a read-only file: locked all the same, and SQLite's open then says what it is
            fd = os.open(database, os.O_RDONLY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            who = f"pid {holder}" if holder else "another process"
            raise DatabaseInUse(
                f"--db {db}: another tidal ({who}) already serves this database (it holds"
                f" the lock on {database}, whatever path or link names it); stop it first,"
                " or give this one another --db"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        return cls(database, fd)

    def release(self) -> None:
        """Only after the database is closed: nothing may write once another can start."""
        if self._fd is not None:
            os.close(self._fd)  # closing drops the lock
            self._fd = None


def _holder(fd: int) -> str | None:
    """The pid that holds the ``flock`` on ``fd``'s file, as /proc/locks lists it (Linux)."""
    st = os.fstat(fd)
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as locks:
            for line in locks:
                parts = line.split()  # "1: FLOCK ADVISORY WRITE PID MAJ:MIN:INODE 0 EOF"
                if len(parts) > 5 and parts[1] == "FLOCK" and parts[5] == inode:
                    return parts[4] if parts[4].isdigit() and parts[4] != "0" else None
    except OSError:
        pass
    return None


def unusable(given: str | Path, database: Path, exc: OSError) -> str:
    """One line naming why a file next to ``database`` could not be created or written."""
    folder = database.parent
    if exc.errno == errno.ENOENT and not folder.is_dir():
        return f"--db {given}: the directory {folder} does not exist; create it first"
    if exc.errno in (errno.EACCES, errno.EPERM):
        closed = _unenterable(folder)
        if closed is not None:
            return (
                f"--db {given}: uid {os.getuid()} cannot enter {closed} (no search"
                f" permission on the directory for this user); tidal needs to reach {folder}"
            )
        return (
            f"--db {given}: permission denied in {folder} for uid {os.getuid()};"
            " tidal needs to create and write files there"
        )
    if exc.errno == errno.EROFS:
        return f"--db {given}: {folder} is on a read-only file system; tidal needs to write there"
    return f"--db {given}: {exc.strerror or exc}"


def _unenterable(folder: Path) -> Path | None:
    """The first directory on the way to ``folder`` that this process may not enter."""
    for step in (*reversed(folder.parents), folder):
        if not os.access(step, os.X_OK):
            return step
    return None

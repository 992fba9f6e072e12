"""Mistakes an operator can make before a single request is served.

Each is told in one line that names the cause, and ``tidal serve`` exits 2:
a wrong path, a bad setting, a database another tidal holds. None of them is
worth a traceback, and none of them may leave anything changed on disk.
"""

from __future__ import annotations


class StartupError(Exception):
    """The server cannot start as configured; the message says why and what to do."""


class BadSettings(StartupError, ValueError):
    """A setting (flag, environment variable or ``Config`` field) breaks its rule."""


class ProtectedMode(StartupError):
    """The server would listen beyond loopback with no token."""


class DatabaseInUse(StartupError):
    """Another tidal serves this database: a second writer would corrupt what it promises."""


class DatabaseUnusable(StartupError):
    """The database cannot be opened for writing: no such directory, no permission, a
    read-only file or file system, or a schema newer than this tidal."""


class CorruptDatabase(StartupError):
    """The database failed its check at boot; the server will not serve it."""

"""Every way the server says no, in one hierarchy, under the protocol's ``TidalError``.

``ServerError``s (``protocol.refusals``) are answered to the client with their wire code
and message;
``StartupError``s are an operator's mistake before a single request is served,
told in one line that names the cause (``tidal serve`` exits 2, nothing changed
on disk); ``StorageFailure`` is a commit that did not happen.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from tidal.protocol.refusals import TidalError, Unavailable

# -- answered to a client: the protocol's classes, one per code (``protocol.refusals``),
# and this one of the server's own


class Full(Unavailable):
    """A write that would create aggregates past the memory budget (``core.budget``):
    nothing of it was applied. Its message begins ``full:``."""


# -- storage ----------------------------------------------------------------


class StorageFailure(TidalError):
    """A commit did not happen. ``transient`` failures (a full disk, a database out of
    reach) may pass; others latch. ``state``: what ``health`` reports for a transient one
    ("full", "unavailable"). ``outcome_unknown``: whether it happened cannot be known (a
    COMMIT's answer lost, and the database not reachable to ask). ``data``: the database
    refused a value the batch carried, and is itself fine: that batch is refused, and
    storage is not thought any the worse for it. ``fenced``: another tidal has taken the
    database over; this one must never write again (the server stops, exit status 3).
    ``moved``: cluster mode: partitions this node no longer owns (another node took them
    while it was paused or cut off); the batch is refused, and the node stops serving them.
    ``refusal``: the storage is fine, and this batch is refused with these words.
    ``stale``: cluster mode: ... because the cohorts changed under it; matched again, it
    may commit."""

    def __init__(
        self,
        message: str,
        *,
        transient: bool,
        state: str = "full",
        outcome_unknown: bool = False,
        data: bool = False,
        fenced: bool = False,
        moved: frozenset[int] = frozenset(),
        refusal: str | None = None,
        stale: bool = False,
    ) -> None:
        super().__init__(message)
        self.stale = stale
        self.moved = moved
        self.refusal = refusal
        self.transient = transient
        self.fenced = fenced
        self.state = state
        self.outcome_unknown = outcome_unknown
        self.data = data


class PartitionsLost(TidalError):
    """Cluster mode: a transaction found partitions it writes for at another epoch than
    the one this node took them at: another node has taken them (``log_sql.FENCE``)."""

    def __init__(self, parts: frozenset[int]) -> None:
        listed = ", ".join(map(str, sorted(parts)))
        many = len(parts) > 1
        super().__init__(
            f"partition{'s' if many else ''} {listed} {'were' if many else 'was'} taken by"
            " another node"
        )
        self.parts = parts


class CohortsChanged(TidalError):
    """Cluster mode: another node changed the cohorts after this batch's signals were
    matched against them (``plans``): the batch is refused, to be sent again."""


class CommitUnknown(TidalError):
    """A COMMIT whose answer was lost: it may or may not have happened. ``settle`` finds out:
    it returns if the commit happened and raises ``StorageFailure`` if it did not, or if that
    cannot be known. Until then nothing may be built on it. ``silent``: the path to the
    database went silent, and finding out waits for it to speak again: its requests are
    told the outcome is unknown meanwhile (``Committer``)."""

    def __init__(
        self, message: str, settle: Callable[[], Awaitable[None]], silent: bool = False
    ) -> None:
        super().__init__(message)
        self.settle = settle
        self.silent = silent


class BackupFailed(TidalError):
    """``tidal backup`` could not make a consistent copy; the message says why."""


# -- an operator's mistake at start --------------------------------------


class StartupError(TidalError):
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

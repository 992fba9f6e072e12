"""What the engine does around each commit, as the committer sees it: the committer knows
the batch and storage, not the state the engine keeps (``steps`` is the engine's side)."""

from __future__ import annotations

from typing import Protocol

from tidal.server.core.batch import Batch


class Steps(Protocol):
    """What the engine does around each commit."""

    def next_seq(self) -> int:
        """The ledger seq the next signal will take: where a new open batch starts."""

    def prepare(self, batch: Batch) -> None:
        """Before ``batch`` commits: add what is due (a checkpoint, old keys to forget)."""

    def busy(self) -> bool:
        """Work due with no request asking: a chunk of rows to rewrite (``core.rewrites``)."""

    def last(self, batch: Batch) -> bool:
        """At shutdown, with nothing left to commit: add a final piece of work, if any."""

    def committed(self, batch: Batch) -> None:
        """``batch`` is durable: take in what it changed."""

    def failed(self, batch: Batch, later: Batch, unknown: bool = False) -> None:
        """``batch`` and ``later``, the open one built on it, were refused (their undo
        already ran). ``unknown``: ``batch``'s COMMIT was cut off, and whether it held could
        not be found out: what was written in it may be saved."""

    def rematch(self, batch: Batch) -> bool:
        """Cluster mode: ``batch``'s commit found the cohorts changed under its signals:
        have it matched again, to be committed anew. False if it cannot be."""

    def unknown(self, batch: Batch, message: str) -> None:
        """``batch``'s COMMIT was cut off, and its outcome is still being found out: what
        waits on it (a purge read while it was open) is told ``message`` now."""

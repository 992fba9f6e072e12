"""Aggregates: per entity, per layer, per kind, a count and a weight sum, and when their
table and the board's buckets are written (a checkpoint).

They are a view of the ledger. Every ledger row carries what its signal was
forwarded to (communities and cohort ids), so the board on disk need not be written
with every group commit: the board (``board``) holds every aggregate in memory,
with what is committed, and now and then a checkpoint writes the aggregates it
changed since the last, as it holds them, together with the ledger seq they run
to (the watermark). Boot replays the ledger past the watermark. The writer then
pays one ledger row per signal, and one record per changed aggregate per
checkpoint (``chunks``) rather than per batch; a signal is counted once, on the board, when
its batch has committed.
"""

from __future__ import annotations

import time
from typing import Final

from .board import Board

#: A checkpoint is due after this many signals or this many seconds, whichever first.
CHECKPOINT_SIGNALS: Final = 200_000
CHECKPOINT_SECONDS: Final = 10.0
#: ... or once this many tallies changed since the last: so many are packed in one go,
#: holding the writer 0.1-0.15 s under load (at 500,000, about 0.6 s: every client's
#: writes wait for it)
CHECKPOINT_TALLIES: Final = 100_000


class Aggregates:
    """When the next checkpoint is due."""

    def __init__(
        self,
        *,
        every_signals: int = CHECKPOINT_SIGNALS,
        every_seconds: float = CHECKPOINT_SECONDS,
        every_tallies: int = CHECKPOINT_TALLIES,
    ) -> None:
        self.every_signals = every_signals
        self.every_seconds = every_seconds
        self.every_tallies = every_tallies
        self._signals = 0  # committed since the last checkpoint began
        self._since = time.monotonic()

    def signals_committed(self, signals: int) -> None:
        self._signals += signals

    def due(self, board: Board) -> bool:
        if not board.dirty():
            return False
        return (
            self._signals >= self.every_signals
            or len(board.marked) >= self.every_tallies
            or time.monotonic() - self._since >= self.every_seconds
        )

    def began(self) -> None:
        self._signals = 0
        self._since = time.monotonic()

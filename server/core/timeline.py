"""When each line of a user's history and each event of the change feed happens: later than
every one before, so that a user's history pages by time exactly, even if the wall clock
steps back. One timeline for the writes that record them (``engine.changes``) and the
purges and erasures that join a batch later (``engine.past``)."""

from __future__ import annotations

from collections.abc import Callable


class Timeline:
    def __init__(self, last_ns: int, clock: Callable[[], int]) -> None:
        self.last_ns = last_ns  # the latest line or event so far
        self._clock = clock

    def now(self) -> int:
        """The time the next line or event would take (nothing is taken yet)."""
        return max(self._clock(), self.last_ns + 1)

    def saw(self, at_ns: int) -> None:
        """A line or event at ``at_ns`` was recorded."""
        self.last_ns = max(self.last_ns, at_ns)

    def take(self) -> int:
        """The next time, taken."""
        at = self.now()
        self.last_ns = at
        return at

"""The windows of every tally, sliding: per tier (minutes, hours), a log per bucket of
what tallies gained in it (``tallies.Log``); a window slides by taking off the bucket
that leaves it (``advance``), so no signal is visited twice. The board (``board``) is
made on it; the rules of time are in ``windows``.
"""

from __future__ import annotations

from collections.abc import Iterable

from .tallies import Log, Tally
from .windows import HOUR_NS, KEEP, MINUTE_NS


class Sliding:
    def __init__(self, now_ns: int) -> None:
        self.minute = now_ns // MINUTE_NS
        self.hour = now_ns // HOUR_NS
        #: per tier, bucket to its log (``Log``): what tallies gained in it
        self.buckets: tuple[dict[int, Log], dict[int, Log]] = ({}, {})
        #: the buckets with lines not on disk yet (tier, bucket): the next checkpoint's
        self.touched: set[tuple[int, int]] = set()

    def _bucket(self, tally: Tally, tier: int, b: int, count: int, weight: float) -> None:
        """A signal in a bucket other than the tally's newest: a newer one becomes its
        newest (what the last held goes to that bucket's log), an older one's log takes it."""
        kept = self.buckets[tier]
        log = kept.get(b)
        if log is None:
            log = kept[b] = Log()
        if b > (tally.minute if tier == 0 else tally.hour):
            self._settle(tally, tier)
            log.newest.append(tally)
            if tier == 0:
                tally.minute, tally.minute_count, tally.minute_weight = b, count, weight
                tally.minute_count_written, tally.minute_weight_written = 0, 0.0
            else:
                tally.hour, tally.hour_count, tally.hour_weight = b, count, weight
                tally.hour_count_written, tally.hour_weight_written = 0, 0.0
            return
        log.add(tally, count, weight)
        self.touched.add((tier, b))

    def _settle(self, tally: Tally, tier: int) -> None:
        """What the tally holds of its newest bucket goes to that bucket's log, less what
        checkpoints wrote of it (``Log.credit``)."""
        if tier == 0:
            b, count, weight, wrote, wrote_weight = (
                tally.minute,
                tally.minute_count,
                tally.minute_weight,
                tally.minute_count_written,
                tally.minute_weight_written,
            )
        else:
            b, count, weight, wrote, wrote_weight = (
                tally.hour,
                tally.hour_count,
                tally.hour_weight,
                tally.hour_count_written,
                tally.hour_weight_written,
            )
        log = self.buckets[tier].get(b)
        if log is None:
            return  # no window reads it any more (or it had none)
        if count or weight:
            log.add(tally, count, weight)
        if wrote or wrote_weight:
            log.credit.append((tally, -wrote, -wrote_weight))
        self.touched.add((tier, b))

    def entry(self, tally: Tally, tier: int, b: int) -> tuple[int, float] | None:
        """Count and weight of the tally in bucket ``b`` of ``tier``; None if it has none.
        A scan of the bucket's log: for tests and tools, not for requests."""
        log = self.buckets[tier].get(b)
        return None if log is None else log.entry(tally, tier, b)

    def advance(self, now_ns: int) -> None:
        """Slide every window to ``now_ns``: each bucket that leaves one is taken off."""
        self._slide(0, now_ns // MINUTE_NS, ((0, 60), (1, 1440)))
        self._slide(1, now_ns // HOUR_NS, ((2, 168), (3, 720)))

    def _slide(self, tier: int, current: int, leaving: tuple[tuple[int, int], ...]) -> None:
        was = self.minute if tier == 0 else self.hour
        if current <= was:
            return
        buckets = self.buckets[tier]
        for window, n in leaving:
            # the buckets in (was - n, current - n] leave the window
            if current - was <= n:
                gone: Iterable[int] = range(was - n + 1, current - n + 1)
            else:
                gone = sorted(b for b in buckets if was - n < b <= current - n)
            for b in gone:
                log = buckets.get(b)
                if log is not None:
                    log.leave(tier, b, window)
        for b in [b for b in buckets if b <= current - KEEP[tier]]:
            del buckets[b]
            self.touched.discard((tier, b))
        if tier == 0:
            self.minute = current
        else:
            self.hour = current

"""What contributions add up to per aggregate and bucket, as rows of (aggregate, tier,
bucket, count, weight): a purge's or erase's share for its ``withdrawals`` record, a
half-life filled from the ledger, the row tables of before. Per ledger row withdrawn,
so compiled."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final, TypeAlias

from . import windows
from .ledger import COHORT, COMMUNITY, LEDGER
from .tallies import Contribution

TREND: Final = 2  # the tier of decayed sums: the bucket is the half-life, in s


def horizons(now_ns: int) -> tuple[int, int]:
    """The newest minute and hour bucket no window reads any more."""
    (minute, minutes), (hour, hours) = windows.TIERS
    return now_ns // minute - minutes, now_ns // hour - hours


def _columns(
    cohorts: Sequence[int], communities: Sequence[str], ledger_too: bool
) -> list[tuple[int, int, str]]:
    """The (layer, cohort, name) of each aggregate a contribution reaches."""
    columns: list[tuple[int, int, str]] = [(COHORT, cid, "") for cid in cohorts]
    for name in communities:
        columns.append((COMMUNITY, 0, name))
    if ledger_too:
        columns.append((LEDGER, 0, ""))
    return columns


#: what a contribution reaches: entity, kind, cohorts, communities, and the ledger or not
Reach: TypeAlias = tuple[str, str, tuple[int, ...], tuple[str, ...], bool]


def aggregate_rows(contributions: Iterable[Contribution]) -> list[tuple[Any, ...]]:
    """(entity, layer, cohort, name, kind, count, weight) rows: the contributions summed
    per aggregate, as the ``aggregates`` table keeps them. Summed per reach first: a
    user's rows share few reaches, and each reaches several aggregates."""
    by_reach: dict[Reach, list[Any]] = {}
    for entity, kind, sign, weight, _, cohorts, communities, ledger_too in contributions:
        add(by_reach, (entity, kind, tuple(cohorts), tuple(communities), ledger_too), sign, weight)
    sums: dict[tuple[Any, ...], list[Any]] = {}
    for (entity, kind, cohorts, communities, ledger_too), (count, weight) in by_reach.items():
        for layer, cohort, name in _columns(cohorts, communities, ledger_too):
            add(sums, (entity, layer, cohort, name, kind), count, weight)
    return [(*key, count, weight) for key, (count, weight) in sums.items()]


class _Buckets:
    """One reach's sums: [count, weight] per minute and per hour, and per half-life its
    decayed sum (None while no signal weighed in it)."""

    __slots__ = ("hours", "minutes", "trends")

    def __init__(self, half_lives: int) -> None:
        self.minutes: dict[int, list[Any]] = {}
        self.hours: dict[int, list[Any]] = {}
        self.trends: list[float | None] = [None] * half_lives


def bucket_rows(
    contributions: Iterable[Contribution], decay: Sequence[tuple[int, int]], now_ns: int,
    trends_only: Sequence[int] | None = None,
) -> list[tuple[Any, ...]]:  # fmt: skip
    """(entity, layer, cohort, name, kind, tier, bucket, count, weight) rows: the
    contributions summed per aggregate and bucket. With ``trends_only``, only those
    half-lives' decayed sums. A decayed sum of 0.0 (a signal too old to weigh) is left out:
    adding it changes nothing.

    Summed per reach first, by buckets' numbers, then spread over the reach's
    aggregates: a key of seven per aggregate, tier and bucket made for each row took
    55-90 ms for a user's 10,000 rows spread over days, in compiled code that holds the
    GIL (a survey's, beside the event loop), and 30-45 ms this way."""
    old_minute, old_hour = horizons(now_ns)
    halves = [(hl, base) for hl, base in decay if trends_only is None or hl in trends_only]
    by_reach: dict[Reach, _Buckets] = {}
    for entity, kind, sign, weight, at_ns, cohorts, communities, ledger_too in contributions:
        reach = (entity, kind, tuple(cohorts), tuple(communities), ledger_too)
        sums = by_reach.get(reach)
        if sums is None:
            sums = by_reach[reach] = _Buckets(len(halves))
        if trends_only is None:
            m = at_ns // windows.MINUTE_NS
            if m > old_minute:
                add(sums.minutes, m, sign, weight)
            h = at_ns // windows.HOUR_NS
            if h > old_hour:
                add(sums.hours, h, sign, weight)
        trends = sums.trends
        for i, (hl, base) in enumerate(halves):
            value = weight * windows.decay_factor(at_ns, base, hl)
            if value:
                was = trends[i]
                trends[i] = value if was is None else was + value
    out: dict[tuple[Any, ...], list[Any]] = {}
    for (entity, kind, cohorts, communities, ledger_too), sums in by_reach.items():
        for layer, cohort, name in _columns(cohorts, communities, ledger_too):
            for m, (count, weight) in sums.minutes.items():
                add(out, (entity, layer, cohort, name, kind, 0, m), count, weight)
            for h, (count, weight) in sums.hours.items():
                add(out, (entity, layer, cohort, name, kind, 1, h), count, weight)
            for (hl, _), trend in zip(halves, sums.trends, strict=True):
                if trend is not None:
                    add(out, (entity, layer, cohort, name, kind, TREND, hl), 0, trend)
    return [(*key, count, weight) for key, (count, weight) in out.items()]


def add(sums: dict[Any, list[Any]], key: Any, count: int, weight: float) -> None:
    """``count`` and ``weight`` added to ``key``'s [count, weight] in ``sums``: the one
    accumulation of a withdrawal's rows and a half-life's sums."""
    entry = sums.get(key)
    if entry is None:
        sums[key] = [count, weight]
    else:
        entry[0] += count
        entry[1] += weight

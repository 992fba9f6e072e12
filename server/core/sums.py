"""What contributions add up to per aggregate and bucket, as rows of (aggregate, tier,
bucket, count, weight): a purge's or erase's share for its ``withdrawals`` record, a
half-life filled from the ledger, the row tables of before. Per ledger row withdrawn,
so compiled."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

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


def aggregate_rows(contributions: Iterable[Contribution]) -> list[tuple[Any, ...]]:
    """(entity, layer, cohort, name, kind, count, weight) rows: the contributions summed
    per aggregate, as the ``aggregates`` table keeps them."""
    sums: dict[tuple[Any, ...], list[Any]] = {}
    for entity, kind, sign, weight, _, cohorts, communities, ledger_too in contributions:
        for layer, cohort, name in _columns(cohorts, communities, ledger_too):
            add(sums, (entity, layer, cohort, name, kind), sign, weight)
    return [(*key, count, weight) for key, (count, weight) in sums.items()]


def bucket_rows(
    contributions: Iterable[Contribution], decay: Sequence[tuple[int, int]], now_ns: int,
    trends_only: Sequence[int] | None = None,
) -> list[tuple[Any, ...]]:  # fmt: skip
    """(entity, layer, cohort, name, kind, tier, bucket, count, weight) rows: the
    contributions summed per aggregate and bucket. With ``trends_only``, only those
    half-lives' decayed sums. A decayed sum of 0.0 (a signal too old to weigh) is left out:
    adding it changes nothing."""
    old_minute, old_hour = horizons(now_ns)
    sums: dict[tuple[Any, ...], list[Any]] = {}
    for entity, kind, sign, weight, at_ns, cohorts, communities, ledger_too in contributions:
        columns = _columns(cohorts, communities, ledger_too)
        m = at_ns // windows.MINUTE_NS
        h = at_ns // windows.HOUR_NS
        decayed: list[tuple[int, float]] = []
        for hl, base in decay:
            if trends_only is None or hl in trends_only:
                value = weight * windows.decay_factor(at_ns, base, hl)
                if value:
                    decayed.append((hl, value))
        for layer, cohort, name in columns:
            keys: list[tuple[tuple[Any, ...], int, float]] = []
            if trends_only is None:
                if m > old_minute:
                    keys.append(((entity, layer, cohort, name, kind, 0, m), sign, weight))
                if h > old_hour:
                    keys.append(((entity, layer, cohort, name, kind, 1, h), sign, weight))
            for hl, value in decayed:
                keys.append(((entity, layer, cohort, name, kind, TREND, hl), 0, value))
            for key, count, amount in keys:
                add(sums, key, count, amount)
    return [(*key, count, weight) for key, (count, weight) in sums.items()]


def add(sums: dict[Any, list[Any]], key: Any, count: int, weight: float) -> None:
    """``count`` and ``weight`` added to ``key``'s [count, weight] in ``sums``: the one
    accumulation of a withdrawal's rows and a half-life's sums."""
    entry = sums.get(key)
    if entry is None:
        sums[key] = [count, weight]
    else:
        entry[0] += count
        entry[1] += weight

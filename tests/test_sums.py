"""Sans-I/O: a withdrawal's rows summed per aggregate and bucket (``core.sums``) are what
the rows add up to, one by one. The sums are taken per reach first (issue 55: a key per
row, aggregate and bucket held the GIL 55-90 ms for a purge of 10,000 rows), so the
reference here is the plain per-row sum they replaced."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tidal.server.core import windows
from tidal.server.core.ledger import COHORT, COMMUNITY, LEDGER
from tidal.server.core.sums import TREND, aggregate_rows, bucket_rows, horizons
from tidal.server.core.tallies import Contribution

NOW = time.time_ns()
DECAY = [(21_600, NOW - 10**12), (604_800, NOW)]
AGES = [0, 10**9, 3_600 * 10**9, 2 * 86_400 * 10**9, 40 * 86_400 * 10**9, 10**21]
REACHES = st.tuples(
    st.lists(st.sampled_from([1, 2, 3]), max_size=2, unique=True),
    st.lists(st.sampled_from(["a", "b"]), max_size=2, unique=True),
    st.booleans(),
)


def _columns(c: Contribution) -> list[tuple[int, int, str]]:
    return [
        *((COHORT, cid, "") for cid in c[5]),
        *((COMMUNITY, 0, name) for name in c[6]),
        *([(LEDGER, 0, "")] if c[7] else []),
    ]


def reference(contributions: list[Contribution], only: Sequence[int] | None) -> dict[Any, Any]:
    """Each row added to each key it reaches, in row order."""
    old_minute, old_hour = horizons(NOW)
    sums: dict[Any, list[Any]] = {}
    for c in contributions:
        entity, kind, sign, weight, at_ns = c[:5]
        for layer, cohort, name in _columns(c):
            keys = []
            if only is None:
                if at_ns // windows.MINUTE_NS > old_minute:
                    keys.append(((0, at_ns // windows.MINUTE_NS), sign, weight))
                if at_ns // windows.HOUR_NS > old_hour:
                    keys.append(((1, at_ns // windows.HOUR_NS), sign, weight))
            for hl, base in DECAY:
                value = weight * windows.decay_factor(at_ns, base, hl)
                if (only is None or hl in only) and value:
                    keys.append(((TREND, hl), 0, value))
            for bucket, count, amount in keys:
                entry = sums.setdefault((entity, layer, cohort, name, kind, *bucket), [0, 0.0])
                entry[0] += count
                entry[1] += amount
    return sums


def same(got: list[tuple[Any, ...]], want: dict[Any, Any], exact: bool, scale: float) -> None:
    rows = {row[:-2]: row[-2:] for row in got}
    assert len(rows) == len(got), "a key twice"
    assert rows.keys() == want.keys()
    for key, (count, weight) in rows.items():
        assert count == want[key][0], key
        if exact:  # one reach per key: the same additions in the same order
            assert weight == want[key][1], key
        else:  # summed per reach first: another order, so another rounding
            assert math.isclose(weight, want[key][1], rel_tol=1e-12, abs_tol=1e-14 * scale), key


@settings(max_examples=300, deadline=None)
@given(
    reaches=st.lists(REACHES, min_size=1, max_size=3),
    rows=st.lists(
        st.tuples(
            st.integers(0, 3),
            st.integers(0, 2),
            st.sampled_from([1, -1]),
            st.sampled_from([1.0, -2.5, 0.0, 0.1, 3e6]),
            st.sampled_from(AGES),
        ),
        max_size=120,
    ),
    only=st.sampled_from([None, [21_600], [604_800], []]),
)
def test_sums_are_the_rows_added_one_by_one(
    reaches: list[tuple[list[int], list[str], bool]],
    rows: list[tuple[int, int, int, float, int]],
    only: list[int] | None,
) -> None:
    contributions: list[Contribution] = []
    for entity, reach, sign, weight, age in rows:
        cohorts, communities, ledger_too = reaches[reach % len(reaches)]
        contributions.append(
            (f"e{entity}", "view", sign, weight, NOW - age, cohorts, communities, ledger_too)
        )
    exact = len(reaches) == 1
    scale = (len(rows) + 1) * 3e6
    totals: dict[Any, list[Any]] = {}
    for c in contributions:  # all-time: every row counts
        for layer, cohort, name in _columns(c):
            entry = totals.setdefault((c[0], layer, cohort, name, c[1]), [0, 0.0])
            entry[0] += c[2]
            entry[1] += c[3]
    same(aggregate_rows(contributions), totals, exact, scale)
    same(bucket_rows(contributions, DECAY, NOW, only), reference(contributions, only), exact, scale)

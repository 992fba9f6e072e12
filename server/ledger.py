"""A ledger row, and the rule for which aggregates a signal counts toward.

Every signal becomes one row. Its context records what the signal named
(communities, attrs) and which cohorts it reached, so the ledger alone can
rebuild every aggregate: at boot past the last checkpoint, and for whatever
later reads the past. Counting a signal live and counting its row again must
agree, so both go through ``count`` here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final, TypeAlias

import msgpack

from .params import Scalar

LEDGER, COHORT, COMMUNITY = 0, 1, 2

#: (layer, key, kind): key is "" for the ledger, a cohort id, or a community name
Slot: TypeAlias = tuple[int, int | str, str]

#: seq, user_id (signed), entity, kind, weight, ts_ns, forwarded, context
Row: TypeAlias = tuple[int, int, str, str, float, int, bool, bytes | None]

_pack: Final[Callable[[Any], bytes]] = msgpack.Packer(use_bin_type=True).pack


def context(
    communities: Sequence[str], attrs: dict[str, Scalar], cohorts: Sequence[int]
) -> bytes | None:
    """``[communities, attrs, cohort ids]``, or None when the signal named nothing."""
    return _pack((communities, attrs, cohorts)) if communities or attrs else None


def decode(blob: bytes | None) -> tuple[list[str], dict[str, Scalar], list[int]]:
    if blob is None:
        return [], {}, []
    communities, attrs, cohorts = msgpack.unpackb(blob, raw=False)
    return communities, attrs, cohorts


def bump(tallies: dict[Slot, list[Any]], slot: Slot, weight: float) -> None:
    """One signal more in ``slot``."""
    tally = tallies.get(slot)
    if tally is None:
        tallies[slot] = [1, weight]
    else:
        tally[0] += 1
        tally[1] += weight


def count(
    tallies: dict[Slot, list[Any]],
    kind: str,
    weight: float,
    cohorts: Sequence[int],
    communities: Sequence[str],
) -> None:
    """One signal into an entity's tallies: the ledger always; each cohort it matched and
    each community it named only if it was forwarded (a gated signal passes none)."""
    bump(tallies, (LEDGER, "", kind), weight)
    for cid in cohorts:
        bump(tallies, (COHORT, cid, kind), weight)
    for name in communities:
        bump(tallies, (COMMUNITY, name, kind), weight)

"""A ledger row, and the rule for which aggregates a signal counts toward.

Every signal becomes one row. Its context records what the signal named
(communities, attrs) and which cohorts it reached, so the ledger alone can
rebuild every aggregate: at boot past the last checkpoint, and for whatever
later reads the past. Counting a signal, counting its row again, and withdrawing
it (purge, erase) must agree: each reads a row's reach with ``decode`` and its
weight with ``row_weight``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeAlias

import msgpack

from tidal.protocol.limits import WEIGHT_MAX

from .params import Scalar

#: user ids are unsigned 64-bit on the wire; both backends store signed 64-bit integers.
#: The one rule between the two: ``to_db`` as a row is made, ``from_db`` as one is read
#: (the engine and the past key everything by the wire's user_id)
U64: Final = 2**64
I64_MAX: Final = 2**63 - 1


def to_db(user_id: int) -> int:
    return user_id - U64 if user_id > I64_MAX else user_id


def from_db(value: int) -> int:
    return value + U64 if value < 0 else value


LEDGER, COHORT, COMMUNITY = 0, 1, 2

#: (layer, key, kind): key is "" for the ledger, a cohort id, or a community name
Slot: TypeAlias = tuple[int, int | str, str]

#: seq, user_id (signed), entity, kind, weight, ts_ns, forwarded (0 or 1), context, and at_ns:
#: when the signal happened, if the caller said, else -1 (stored as NULL: it is ts_ns, when
#: the server read it). Only values SQLite binds without adapting: a bool, bytes or None
#: costs a failed adapter lookup each, about 1 us, which for a ledger row was 70% of its
#: insert (test_storable.py::test_a_ledger_row_holds_what_its_signal_said reads the file)
Row: TypeAlias = tuple[int, int, str, str, float, int, int, bytearray | None, int]
NOT_GIVEN: Final = -1  # a row's at_ns when the caller did not say

_pack: Final[Callable[[Any], bytes]] = msgpack.Packer(use_bin_type=True).pack


def context(
    communities: Sequence[str], attrs: dict[str, Scalar], cohorts: Sequence[int]
) -> bytearray | None:
    """``[communities, attrs, cohort ids]``, or None when the signal named nothing and
    reached nothing (a cohort with an empty predicate takes signals without attributes)."""
    if communities or attrs or cohorts:
        return bytearray(_pack((communities, attrs, cohorts)))
    return None


def decode(blob: bytes | bytearray | None) -> tuple[list[str], dict[str, Scalar], list[int]]:
    if blob is None:
        return [], {}, []
    communities, attrs, cohorts = msgpack.unpackb(blob, raw=False)
    return communities, attrs, cohorts


def row_weight(weight: float) -> float:
    """What a stored row counts for. Rows written by a tidal that did not bound weights
    count at the bound, so that no sum becomes inf - inf = NaN, which no checkpoint
    could store; replay and withdrawal must read a row alike."""
    if -WEIGHT_MAX <= weight <= WEIGHT_MAX:
        return weight
    return math.copysign(WEIGHT_MAX, weight) if weight == weight else 0.0

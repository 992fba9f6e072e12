"""Cluster mode's commit log: what each commit changed of the state every node keeps
whole (the board's aggregates, the cohorts), in one order for every node.

A node's transaction takes the next id of one row last before its COMMIT (``plans``):
that row's lock makes ids follow commit order with no gaps, across nodes. Every node
applies every record in id order, its own with the rest, so each holds the board of
the whole cluster and the same cohorts, as one tidal would.
"""

from __future__ import annotations

from typing import Any

import msgpack

from .batch import Batch
from .matching import Cohort
from .tallies import Contribution

#: a record's cohort changes: (name, id, predicate as msgpack) defined, (name,) dropped
CohortChange = tuple[Any, ...]


def encode(batch: Batch) -> bytes | None:
    """What ``batch`` changes of the state every node keeps; None if nothing."""
    if not batch.board and not batch.cohorts:
        return None
    cohorts = [
        (name, c.id, msgpack.packb(c.predicate, use_bin_type=True)) if c is not None else (name,)
        for name, c in batch.cohorts.items()
    ]
    packed: bytes = msgpack.packb((batch.board, cohorts), use_bin_type=True)
    return packed


def decode(record: bytes) -> tuple[list[Contribution], list[CohortChange]]:
    board, cohorts = msgpack.unpackb(record, raw=False, use_list=False)
    return list(board), list(cohorts)


def cohort(change: CohortChange) -> tuple[str, Cohort | None]:
    """A record's cohort change as the registry takes it."""
    if len(change) == 1:
        return change[0], None
    name, cid, predicate = change
    return name, Cohort.build(cid, name, msgpack.unpackb(predicate, raw=False))

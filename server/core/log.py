"""Cluster mode's commit log: what each commit changed of the state every node keeps
whole (the board's aggregates, the cohorts) and its change feed events, in one order for
every node.

A node's transaction takes the next id of one row last before its COMMIT (``plans``):
that row's lock makes ids follow commit order with no gaps, across nodes. Every node
applies every record in id order, its own with the rest, so each holds the board of
the whole cluster and the same cohorts, as one tidal would, and pushes every node's
events to its subscribers in the same order. An event's id is its place among all the
events of the log, counted in the same row: the node that commits it and every node that
applies it give it the same id, and encode it to the same bytes.
"""

from __future__ import annotations

from typing import Any

import msgpack

from .batch import Batch
from .feed import Change
from .matching import Cohort
from .past import Withdrawal
from .tallies import Contribution

#: a record's cohort changes: (name, id, predicate as msgpack) defined, (name,) dropped
CohortChange = tuple[Any, ...]
#: a record's events: (kind, at_ns, user_id, left_at_ns, name, predicate as msgpack,
#: and for a purge or erase (erase, signals))
EventFields = tuple[Any, ...]


def board(batch: Batch) -> list[Contribution]:
    """What ``batch`` changes on the board: its signals, then what its withdrawals take off."""
    if not batch.past:
        return batch.board
    return batch.board + [c for w in batch.past for c in w.board]


def encode(batch: Batch) -> bytes | None:
    """What ``batch`` changes of the state every node keeps; None if nothing. A batch with
    a purge or erase is encoded only once the writer has found what it took off."""
    if not batch.board and not batch.cohorts and not batch.changes and not batch.past:
        return None
    cohorts = [
        (name, c.id, msgpack.packb(c.predicate, use_bin_type=True)) if c is not None else (name,)
        for name, c in batch.cohorts.items()
    ]
    events = [
        (c.kind, c.at_ns, c.user_id, c.left_at_ns, c.name,
         None if c.predicate is None else msgpack.packb(c.predicate, use_bin_type=True),
         None if c.withdrawal is None else (c.withdrawal.erase, c.withdrawal.signals))
        for c in batch.changes
    ]  # fmt: skip
    packed: bytes = msgpack.packb((board(batch), cohorts, events), use_bin_type=True)
    return packed


def decode(record: bytes) -> tuple[list[Contribution], list[CohortChange], list[EventFields]]:
    board, cohorts, events = msgpack.unpackb(record, raw=False, use_list=False)
    return list(board), list(cohorts), list(events)


def changes(events: list[EventFields], first_id: int) -> list[Change]:
    """A record's events as this node pushes them: ids from ``first_id``, encoded."""
    out = []
    for i, (kind, at_ns, user_id, left_at_ns, name, predicate, *rest) in enumerate(events):
        change = Change(kind, at_ns, user_id, left_at_ns, None, name, None, first_id + i)
        withdrawn = rest[0] if rest else None  # a record of the first cluster build: none
        if withdrawn is not None:  # its count, as the committing node found it
            erase, signals = withdrawn
            change.withdrawal = Withdrawal(user_id, 0, erase, signals=signals)
        if predicate is not None:
            change.predicate = msgpack.unpackb(predicate, raw=False)
        change.encode()
        out.append(change)
    return out


def cohort(change: CohortChange) -> tuple[str, Cohort | None]:
    """A record's cohort change as the registry takes it."""
    if len(change) == 1:
        return change[0], None
    name, cid, predicate = change
    return name, Cohort.build(cid, name, msgpack.unpackb(predicate, raw=False))

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

A batch of signals only (the most of them) has no record of its own: the statement that
inserts its ledger rows puts the same columns in the log's row (``log_sql._LOGGED``), and a
node applying it makes each row's contribution again, as the committing node made it
(``engine.signalling``). The signal path then encodes nothing but its rows: encoding
each contribution again, as msgpack, cost 2-3% of a cluster node's CPU per signal.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import msgpack

from . import ledger
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


#: the form of the log's rows this tidal writes (``tidal_cluster.log_format``): 2, a batch
#: of signals only as its rows' columns. A node refuses a cluster whose form is newer; an
#: older node, which cannot read these rows, has to be stopped before this one starts
FORMAT: Final = 2
#: a row of the log as read: id, node, record, and for a batch of signals only its ledger
#: rows' columns, in seq order (NULLs otherwise): entity, kind, weight, ts_ns, at_ns (or
#: ``ledger.NOT_GIVEN``), forwarded, context
COLUMNS: Final = "id, node, record, entities, kinds, weights, ts, ats, forwarded, contexts"
Row = tuple[Any, ...]


def shared(batch: Batch) -> bool:
    """Whether ``batch`` changes the state every node keeps: it then has a place in the log."""
    return bool(batch.board or batch.cohorts or batch.changes or batch.past)


def signals_only(batch: Batch) -> bool:
    """A batch whose record is its ledger rows' columns: signals, and nothing else that the
    log or the order of its transaction's locks cares about (``plans``: such a batch writes
    its rows and takes the log's head in one statement, last)."""
    return not (
        batch.cohorts
        or batch.changes
        or batch.past
        or batch.rewrite
        or batch.retire
        or batch.forget_keys_before is not None
        or batch.probe
    )


def board(batch: Batch) -> list[Contribution]:
    """What ``batch`` changes on the board: its signals, then what its withdrawals take off."""
    if not batch.past:
        return batch.board
    return batch.board + [c for w in batch.past for c in w.board]


def encode(batch: Batch) -> bytes:
    """What ``batch`` changes of the state every node keeps, but for a batch of signals
    only (see above). A batch with a purge or erase is encoded once the writer has found
    what it took off."""
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


def decode(row: Row) -> tuple[list[Contribution], list[CohortChange], list[EventFields]]:
    """A row of the log (``COLUMNS``): what it adds to the board, its cohort changes and
    its events."""
    if row[3] is not None:  # a batch of signals only
        return signals(*row[3:10]), [], []
    board, cohorts, events = msgpack.unpackb(row[2], raw=False, use_list=False)
    return list(board), list(cohorts), list(events)


def signals(
    entities: Sequence[str],
    kinds: Sequence[str],
    weights: Sequence[float],
    ts: Sequence[int],
    ats: Sequence[int],
    forwarded: Sequence[int],
    contexts: Sequence[bytes | None],
) -> list[Contribution]:
    """Each ledger row's contribution, as the signal path made it (``engine.signalling``):
    the ledger's aggregate, and if forwarded the cohorts and communities its context
    records it reached."""
    out: list[Contribution] = []
    for entity, kind, weight, ts_ns, at_ns, fwd, context in zip(
        entities, kinds, weights, ts, ats, forwarded, contexts, strict=True
    ):
        at = ts_ns if at_ns == ledger.NOT_GIVEN else at_ns
        if fwd:
            communities, _, cohorts = ledger.decode(context)
            out.append((entity, kind, 1, weight, at, cohorts, communities, True))
        else:
            out.append((entity, kind, 1, weight, at, (), (), True))
    return out


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

"""Cluster mode: a batch brought up to cohorts changed under it, rather than refused.

A batch commits only at the cohort version its signals were matched against (``plans``),
so that every node's board, summed from the log, is what matching each signal at its
place in the log gives. When a change reaches the cohorts first (another node's, or this
node's own committing), the batch is matched again in memory: each forwarded signal
against the cohorts as they now are (its row's context records what it reached, which a
purge later takes off), and each define or drop of its own decided again. Then it
commits, and no client sees the change. Cohort changes are rare; signals are not, so
this costs a decode per signal only when a change comes.
"""

from __future__ import annotations

import bisect

from tidal.protocol.refusals import InvalidParams

from . import budget as budgets
from . import ledger
from .batch import Batch
from .board import Board
from .budget import Budget
from .cohorts import Registry


def rematch(batch: Batch, cohorts: Registry, board: Board, budget: Budget) -> None:
    """``batch`` as if every request in it had been read after the cohorts' last change."""
    if batch.asks:
        _decide_again(batch, cohorts)
    if not batch.signals:
        return
    rows, contributions, match = batch.ledger, batch.board, cohorts.match
    for i, row in enumerate(rows):
        if not row[6]:  # not forwarded: the ledger's only, whatever the cohorts
            continue
        communities, attrs, before = ledger.decode(row[7])
        now = match(attrs)
        if list(now) == before:
            continue
        entity, kind, count, weight, at_ns, _, named, add = contributions[i]
        contributions[i] = (entity, kind, count, weight, at_ns, now, named, add)
        rows[i] = (*row[:7], ledger.context(communities, attrs, now), row[8])
        batch.fanout += len(now) - len(before)
        grows = budgets.grows(board, batch.creating, entity, kind, now)
        batch.growth += grows
        budget.pending += grows


def _decide_again(batch: Batch, cohorts: Registry) -> None:
    """Its own defines and drops, against the cohorts as they now are: one that no longer
    changes them leaves the batch with its event (a drop then answers false); one that
    does again comes back, its event in time order."""
    for ask in batch.asks:
        batch.cohorts.pop(ask.name, None)
    batch.next_cohort_id = None
    events = batch.changes
    for ask in batch.asks:
        was = ask.changes
        try:
            cohorts.ask(batch, ask)
        except InvalidParams as exc:
            ask.changes, ask.refusal = False, exc.message
        else:
            ask.refusal = None
        if was and not ask.changes:
            events.remove(ask.event)
        elif ask.changes and not was:
            bisect.insort(events, ask.event, key=lambda change: change.at_ns)
    if batch.cohorts:  # the ids this one takes: past every id applied
        batch.next_cohort_id = cohorts.next_id

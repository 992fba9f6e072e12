"""The signal path: ``signal`` and ``signal_batch`` applied the moment they are read (the
gate a dict lookup, then memory only: the batch does the I/O), and the ledger's seqs they
take. Compiled: every signal runs through here."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tidal.protocol.limits import MAX_FANOUT
from tidal.protocol.refusals import InvalidParams
from tidal.server.core import budget, ledger
from tidal.server.core.batch import Batch
from tidal.server.core.board import Board, Key
from tidal.server.core.budget import Budget
from tidal.server.core.cohorts import Registry
from tidal.server.core.keys import Keys
from tidal.server.core.ledger import to_db
from tidal.server.core.members import Members
from tidal.server.core.owners import Router
from tidal.server.core.replies import Replier
from tidal.server.core.signals import SignalArgs, compact_acks, signal_batch, single_signal
from tidal.server.core.windows import AHEAD_NS

from .committer import Committer


class Seqs:
    """The ledger's seqs: the signal path gives them, a refused batch gives its back
    (``participants.Ledger``); cluster mode: none below an older block's."""

    def __init__(self, next_seq: int) -> None:
        self.next = next_seq
        self._floor = next_seq

    def __call__(self) -> int:
        """The seq the next signal takes: where a new open batch starts."""
        return self.next

    def rewind(self, first_seq: int) -> None:
        """A batch from ``first_seq`` on was refused: its seqs are given again."""
        self.next = max(first_seq, self._floor)

    def above(self, first_seq: int) -> None:
        """Cluster mode: partitions taken over; seqs from a block above any their previous
        owner used."""
        self._floor = max(self._floor, first_seq)
        self.next = max(self.next, first_seq)


def _ahead(where: str, at_ns: int, now_ns: int) -> None:
    raise InvalidParams(
        f"{where}: {at_ns} is {(at_ns - now_ns) / 1e9:.0f} s ahead of the server's clock;"
        f" at most {AHEAD_NS // 10**9} s ahead"
    )


class SignalPath:
    def __init__(
        self, members: Members, cohorts: Registry, keys: Keys, board: Board, budget: Budget,
        committer: Committer, seqs: Seqs, clock: Callable[[], int], router: Router,
    ) -> None:  # fmt: skip
        self._members, self._cohorts, self._keys = members, cohorts, keys
        self._board, self._budget, self._committer = board, budget, committer
        self._seqs, self._clock, self._router = seqs, clock, router

    def signal(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        s = single_signal(args)
        batch = self._committer.writable()
        self._router.check(s.user_id, batch)
        now = self._clock()
        if s.at_ns is not None and s.at_ns > now + AHEAD_NS:
            _ahead("context.at_ns", s.at_ns, now)
        # at most, then exactly: near the budget
        if budget.most(1, 1 + len(s.communities) + len(self._cohorts)) > self._budget.room():
            self._room((s,), None, now)
        seq, forwarded = self._record(batch, s, now)
        self._committer.ack(conn, msgid, {"seq": seq, "forwarded": forwarded})

    def signal_batch(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        signals, compact = signal_batch(args)  # all valid, or none applied
        batch = self._committer.writable()
        self._router.check_all([s.user_id for s in signals], batch)  # all here, or none
        now = self._clock()
        for i, s in enumerate(signals):
            if s.at_ns is not None and s.at_ns > now + AHEAD_NS:
                _ahead(f"signals[{i}].context.at_ns", s.at_ns, now)
        record = self._record
        first_seq = self._seqs.next
        n, room = len(signals), self._budget.room()
        if not self._cohorts:  # fan-out is the communities named, bounded by params
            # at most, then exactly: near the budget
            if budget.most(n, n + MAX_FANOUT) > room and (
                budget.most(n, n + sum(len(s.communities) for s in signals)) > room
            ):
                self._room(signals, None, now)
            acks = [record(batch, s, now) for s in signals]
        else:
            # matched first, to bound the request's fan-out before any of it is applied
            is_left = self._members.is_left
            match = self._cohorts.match
            matched = [() if is_left(s.user_id) else match(s.attrs) for s in signals]
            fanout = sum(len(s.communities) + len(m) for s, m in zip(signals, matched, strict=True))
            if fanout > MAX_FANOUT:
                raise InvalidParams(
                    f"signals: this batch adds to {fanout} aggregates (communities named and"
                    f" cohorts matched, per signal); at most {MAX_FANOUT} per request: send"
                    " fewer signals per batch"
                )
            if budget.most(n, n + fanout) > room:
                self._room(signals, matched, now)
            acks = [record(batch, s, now, m) for s, m in zip(signals, matched, strict=True)]
        if compact:
            self._committer.ack(conn, msgid, compact_acks(acks, first_seq))
        else:
            self._committer.ack(conn, msgid, [{"seq": q, "forwarded": f} for q, f in acks])

    def _record(
        self, batch: Batch, s: SignalArgs, now_ns: int, matched: tuple[int, ...] | None = None
    ) -> tuple[int, bool]:
        """The signal path: a dict lookup for the gate, then memory only; the batch does the I/O.
        Its seq, and whether it was forwarded."""
        user_id, entity, kind, weight, communities, attrs, key, at_ns = s
        if key is not None:
            seen = self._keys.seen(key, now_ns, user_id)
            if seen is not None:
                return seen[0], seen[1]  # a retry: counted once
        seqs = self._seqs
        seq = seqs.next
        seqs.next = seq + 1
        forwarded = not self._members.is_left(user_id)  # the gate
        if forwarded:
            cohorts = matched if matched is not None else self._cohorts.match(attrs)
            batch.forwarded += 1
            batch.fanout += len(cohorts) + len(communities)
            grows = budget.grows(
                self._board, batch.creating, entity, kind, (None, *cohorts, *communities)
            )
            if grows:
                batch.growth += grows
                self._budget.pending += grows
            batch.board.append(
                (entity, kind, 1, weight, now_ns if at_ns is None else at_ns, cohorts,
                 communities, True)
            )  # fmt: skip
        else:
            cohorts = ()
            grows = budget.grows(self._board, batch.creating, entity, kind, (None,))  # the ledger's
            if grows:
                batch.growth += grows
                self._budget.pending += grows
            batch.board.append(
                (entity, kind, 1, weight, now_ns if at_ns is None else at_ns, (), (), True)
            )
        context = ledger.context(communities, attrs, cohorts)
        batch.ledger.append(
            (seq, to_db(user_id), entity, kind, weight, now_ns, 1 if forwarded else 0, context,
             ledger.NOT_GIVEN if at_ns is None else at_ns)
        )  # fmt: skip
        if key is not None:
            self._keys.remember(batch, key, (seq, forwarded, now_ns, user_id))
        batch.signals += 1
        batch.writes += 1
        return seq, forwarded

    def _room(
        self, signals: Sequence[SignalArgs], matched: list[tuple[int, ...]] | None, now_ns: int
    ) -> None:
        """Near the memory budget: a request that would create aggregates past it is
        refused whole. The aggregates each signal reaches, as ``_record`` will fan it out
        (a retry of a key already acknowledged reaches none: it is answered as before)."""
        is_left, seen = self._members.is_left, self._keys.seen
        reached: list[tuple[str, str, tuple[Key, ...]]] = []
        for i, s in enumerate(signals):
            if s.key is not None and seen(s.key, now_ns, s.user_id) is not None:
                continue
            if is_left(s.user_id):
                reached.append((s.entity, s.kind, (None,)))
                continue
            cohorts = matched[i] if matched is not None else self._cohorts.match(s.attrs)
            reached.append((s.entity, s.kind, (None, *cohorts, *s.communities)))
        self._budget.check(reached)

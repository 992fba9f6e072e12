"""The engine: requests change memory in the order they are read; replies wait for the disk.

Two promises meet here. *Zero window*: a request is applied the moment it is
read, so a signal read after a leave is gated even before the leave's reply is
sent. *Acknowledged means durable*: every reply that reveals a write waits, in
the committer, until the batch holding that write has committed.

This module is the dispatch table and the signal path; what is done around each commit is
the commit cycle's participants (``cycle``, ``participants``). The other writes are in
``changes``, the reads in ``reads``. The state they change lives in the sans-I/O core
(``tidal.server.core``: members, cohorts, keys, aggregates), each part recording its
changes in the open batch with their undo; the ledger row and the rule for what a signal
counts toward are in ``core.ledger``; group commit is in ``committer``.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from tidal.protocol import DEFAULT_MAX_MESSAGE_SIZE, ErrorCode
from tidal.protocol.errors import quoted
from tidal.protocol.limits import MAX_FANOUT, REPLY_ENVELOPE
from tidal.protocol.refusals import InvalidParams, MethodNotFound, ServerError
from tidal.server.core import budget, ledger, params, restore
from tidal.server.core.aggregates import CHECKPOINT_SECONDS, CHECKPOINT_SIGNALS, Aggregates
from tidal.server.core.batch import Batch
from tidal.server.core.board import Board, Key
from tidal.server.core.budget import Budget
from tidal.server.core.chunks import Shelf
from tidal.server.core.cohorts import Registry
from tidal.server.core.keys import Ack, Keys
from tidal.server.core.ledger import to_db
from tidal.server.core.members import Members
from tidal.server.core.owners import Owners
from tidal.server.core.replies import Replier
from tidal.server.core.rewrites import CHUNK as REWRITE_CHUNK
from tidal.server.core.rewrites import Rewrites, Rule
from tidal.server.core.signals import SignalArgs, compact_acks, signal_batch, single_signal
from tidal.server.core.timeline import Timeline
from tidal.server.core.userrows import UserRows
from tidal.server.core.windows import AHEAD_NS
from tidal.server.metrics import Metrics
from tidal.server.storage.interface import Snapshot, Storage

from .changes import Changes
from .committer import Committer
from .cycle import Cycle
from .dispatch import dispatch
from .handlers import served
from .lineup import line_up
from .publisher import Feed
from .ranked import Ranked
from .reads import Reads
from .replica import Replica
from .retention import Retention
from .room import ReplyRoom
from .withdrawals import Past

log = logging.getLogger("tidal.engine")


def _ahead(where: str, at_ns: int, now_ns: int) -> None:
    raise InvalidParams(
        f"{where}: {at_ns} is {(at_ns - now_ns) / 1e9:.0f} s ahead of the server's clock;"
        f" at most {AHEAD_NS // 10**9} s ahead"
    )


class Engine:
    def __init__(
        self,
        storage: Storage,
        snapshot: Snapshot,
        *,
        clock: Callable[[], int] = time.time_ns,
        connections: Callable[[], int] = lambda: 0,
        checkpoint_signals: int = CHECKPOINT_SIGNALS,
        checkpoint_seconds: float = CHECKPOINT_SECONDS,
        key_window_ns: int = 24 * 3600 * 10**9,
        max_keys: int = 1_000_000,
        metrics: Metrics | None = None,
        hold: Callable[[bool], None] = lambda on: None,
        max_reply: int = DEFAULT_MAX_MESSAGE_SIZE,
        ledger_retention: float = 0.0,
        event_retention: float = 0.0,
        heartbeat: float = 5.0,
        rewrite_chunk: int = REWRITE_CHUNK,
        owners: Owners | None = None,
        memory_budget: tuple[int, str] = (0, ""),
    ) -> None:
        self.storage = storage
        self.owners = owners
        #: cluster mode: seqs below this are an older block's (``cluster``): never given again
        self._seq_floor = snapshot.next_seq
        self.clock = clock
        self.connections = connections
        self.reply_budget = max_reply - REPLY_ENVELOPE
        self.metrics = metrics
        self.members = Members.adopt(snapshot.left, snapshot.rejoined)
        self.cohorts = Registry(snapshot.cohorts, snapshot.next_cohort_id)
        self.keys = Keys(snapshot.keys, key_window_ns, max_keys)
        self.aggregates = Aggregates(
            every_signals=checkpoint_signals, every_seconds=checkpoint_seconds
        )
        on_disk = snapshot.board
        self.board = Board(on_disk.decay, clock())
        self.budget = Budget(self.board, *memory_budget)  # bytes (0: none), as set
        self.shelf = Shelf()
        cohort_ids = set(self.cohorts.names())
        restore.rebuild(self.board, self.shelf, on_disk, snapshot.ledger_tail, cohort_ids)
        self.aggregates.signals_committed(len(snapshot.ledger_tail))
        self.user_rows = UserRows(snapshot.next_block, snapshot.users_tail)
        self._next_seq = snapshot.next_seq
        cycle = Cycle()
        self.committer = Committer(
            storage,
            self.next_seq,
            cycle,
            metrics=metrics,
            hold=hold,
            room=ReplyRoom(self.budget),
        )
        leads = None if owners is None else (lambda: 0 in owners.owned)
        self.retention = Retention(ledger_retention, clock, self.committer, leads)
        timeline = Timeline(snapshot.last_event_ns, clock)  # of history lines and events
        self.past = Past(
            storage,
            self.committer,
            Rewrites(snapshot.rules, rewrite_chunk),
            lambda: self.board.decay,
            clock,
            self.keys,
            self.user_rows,
            timeline,
            owners,
        )
        self.feed = Feed(
            snapshot.last_event_id,
            self.committer,
            clock,
            heartbeat=heartbeat,
            retention=event_retention,
        )
        changes = Changes(self, timeline)
        ranked = Ranked(self, clock)
        reads = self._reads = Reads(self, ranked)
        self.health = reads.health_report
        self._methods = served(self._signal, self._signal_batch, changes, self.feed, reads, ranked)
        #: cluster mode: the board and the cohorts of every node's commits (``replica``)
        self.replica = None if owners is None else Replica(self, owners.node, clock)
        if self.replica is not None:
            self.replica.route(self._methods, self.feed)
        self.ledger = line_up(self, cycle, snapshot.ledger_rows)
        #: each method's handler and how many params it takes, from the method table
        self._dispatch = dispatch(self._methods)

    @property
    def signals(self) -> int:
        """Signals committed since boot."""
        return self.ledger.signals

    @property
    def forwarded(self) -> int:
        """... and of those, forwarded to cohorts and communities."""
        return self.ledger.forwarded

    @property
    def ledger_rows(self) -> int:
        """Rows the ledger keeps now."""
        return self.ledger.rows

    @property
    def tallies(self) -> int:
        """Aggregates held (the metrics read it from their own thread)."""
        return self.board.tallies

    def start(self) -> None:
        self.committer.start()
        self.retention.start()
        self.feed.start()
        self.past.start()

    async def close(self) -> None:
        """Commit and answer everything already read, then stop the writer."""
        self.retention.stop()
        self.feed.stop()
        await self.past.close()  # every withdrawal read joins a batch, or is refused
        await self.committer.close()
        await self._reads.close()  # the reads beside the writer, whose writes are done

    def handle(self, conn: Replier, msgid: int | None, method: str, args: list[Any]) -> None:
        """Apply one request now; its reply goes out now or when its batch is durable.

        ``msgid`` is None for a notification: it is applied, never answered.
        """
        try:
            entry = self._dispatch.get(method)
            if entry is None:
                raise MethodNotFound(f"method not found: {quoted(method)}")
            handler, least, most, edge = entry
            if not least <= len(args) <= most:
                params.arity_of(method, args)
            handler(conn, msgid, args if edge is None else edge.parse(args))
        except ServerError as exc:
            conn.reply_error(msgid, exc.code, exc.message)
        except Exception:
            log.exception("internal error in %s", method)
            conn.reply_error(msgid, ErrorCode.INTERNAL_ERROR, f"internal error in {method}")

    # -- writes ----------------------------------------------------------

    def _signal(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        s = single_signal(args)
        batch = self.committer.writable()
        if self.owners is not None:
            self.owners.check(s.user_id, batch)
        now = self.clock()
        if s.at_ns is not None and s.at_ns > now + AHEAD_NS:
            _ahead("context.at_ns", s.at_ns, now)
        # at most, then exactly: near the budget
        if budget.most(1, 1 + len(s.communities) + len(self.cohorts)) > self.budget.room():
            self._room((s,), None, now)
        seq, forwarded = self._record(batch, s, now)
        self.committer.ack(conn, msgid, {"seq": seq, "forwarded": forwarded})

    def _signal_batch(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        signals, compact = signal_batch(args)  # all valid, or none applied
        batch = self.committer.writable()
        if self.owners is not None:  # all here, or none applied
            self.owners.check_all([s.user_id for s in signals], batch)
        now = self.clock()
        for i, s in enumerate(signals):
            if s.at_ns is not None and s.at_ns > now + AHEAD_NS:
                _ahead(f"signals[{i}].context.at_ns", s.at_ns, now)
        record = self._record
        first_seq = self._next_seq
        n, room = len(signals), self.budget.room()
        if not self.cohorts:  # fan-out is the communities named, bounded by params
            # at most, then exactly: near the budget
            if budget.most(n, n + MAX_FANOUT) > room and (
                budget.most(n, n + sum(len(s.communities) for s in signals)) > room
            ):
                self._room(signals, None, now)
            acks = [record(batch, s, now) for s in signals]
        else:
            # matched first, to bound the request's fan-out before any of it is applied
            is_left = self.members.is_left
            match = self.cohorts.match
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
            self.committer.ack(conn, msgid, compact_acks(acks, first_seq))
        else:
            self.committer.ack(conn, msgid, [{"seq": q, "forwarded": f} for q, f in acks])

    def _record(
        self, batch: Batch, s: SignalArgs, now_ns: int, matched: tuple[int, ...] | None = None
    ) -> tuple[int, bool]:
        """The signal path: a dict lookup for the gate, then memory only; the batch does the I/O.
        Its seq, and whether it was forwarded."""
        user_id, entity, kind, weight, communities, attrs, key, at_ns = s
        if key is not None:
            seen = self.keys.seen(key, now_ns, user_id)
            if seen is not None:
                return seen[0], seen[1]  # a retry: counted once
        seq = self._next_seq
        self._next_seq = seq + 1
        forwarded = not self.members.is_left(user_id)  # the gate
        if forwarded:
            cohorts = matched if matched is not None else self.cohorts.match(attrs)
            batch.forwarded += 1
            batch.fanout += len(cohorts) + len(communities)
            grows = budget.grows(
                self.board, batch.creating, entity, kind, (None, *cohorts, *communities)
            )
            if grows:
                batch.growth += grows
                self.budget.pending += grows
            batch.board.append(
                (entity, kind, 1, weight, now_ns if at_ns is None else at_ns, cohorts,
                 communities, True)
            )  # fmt: skip
        else:
            cohorts = ()
            grows = budget.grows(self.board, batch.creating, entity, kind, (None,))  # the ledger's
            if grows:
                batch.growth += grows
                self.budget.pending += grows
            batch.board.append(
                (entity, kind, 1, weight, now_ns if at_ns is None else at_ns, (), (), True)
            )
        context = ledger.context(communities, attrs, cohorts)
        batch.ledger.append(
            (seq, to_db(user_id), entity, kind, weight, now_ns, 1 if forwarded else 0, context,
             ledger.NOT_GIVEN if at_ns is None else at_ns)
        )  # fmt: skip
        if key is not None:
            self.keys.remember(batch, key, (seq, forwarded, now_ns, user_id))
        batch.signals += 1
        batch.writes += 1
        return seq, forwarded

    def _room(
        self, signals: Sequence[SignalArgs], matched: list[tuple[int, ...]] | None, now_ns: int
    ) -> None:
        """Near the memory budget: a request that would create aggregates past it is
        refused whole. The aggregates each signal reaches, as ``_record`` will fan it out
        (a retry of a key already acknowledged reaches none: it is answered as before)."""
        is_left, seen = self.members.is_left, self.keys.seen
        reached: list[tuple[str, str, tuple[Key, ...]]] = []
        for i, s in enumerate(signals):
            if s.key is not None and seen(s.key, now_ns, s.user_id) is not None:
                continue
            if is_left(s.user_id):
                reached.append((s.entity, s.kind, (None,)))
                continue
            cohorts = matched[i] if matched is not None else self.cohorts.match(s.attrs)
            reached.append((s.entity, s.kind, (None, *cohorts, *s.communities)))
        self.budget.check(reached)

    # -- the seqs: the signal path's; the commit cycle's ledger gives a refused batch's back

    def next_seq(self) -> int:
        return self._next_seq

    def rewind(self, first_seq: int) -> None:
        """A batch from ``first_seq`` on was refused: its seqs are given again (cluster
        mode: none below an older block's)."""
        self._next_seq = max(first_seq, self._seq_floor)

    # -- cluster mode -----------------------------------------------------

    def adopt(
        self,
        ours: Callable[[int], bool],
        left: dict[int, int],
        rejoined: dict[int, int],
        keys: OrderedDict[str, Ack],
        first_seq: int,
        rules: dict[int, Rule],
    ) -> None:
        """Partitions taken over: their users' state as the database holds it (with the
        rules of purges and erasures whose rows are still to rewrite, which this node
        goes on with), and seqs from a block above any their previous owner used."""
        self.members.reload(ours, left, rejoined)
        self.keys.adopt(ours, keys)
        self.past.adopt(ours, rules)
        self._seq_floor = max(self._seq_floor, first_seq)
        self._next_seq = max(self._next_seq, first_seq)

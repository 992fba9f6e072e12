"""A batch: the writes and waiting replies that one group commit makes durable.

Requests change memory at once, in the order the server reads them, and leave
their SQL work and their reply here; the writer commits a whole batch in one
transaction and only then lets the replies go. ``undo`` lets a failed commit
put memory back as it was, so memory never claims what the disk does not hold.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .board import Board, Changed, Key
from .chunks import Shelf
from .feed import Change, FeedRead
from .group_batch import GroupWrites
from .ledger import Row
from .matching import Cohort
from .replies import Replier, Undo
from .rewrites import Rewrite
from .tallies import Contribution

if TYPE_CHECKING:
    from .asks import CohortAsk
    from .past import Event, HistoryRead, LeftRead, Withdrawal


@dataclass(slots=True)
class Entry:
    """Cluster mode: a batch's place in the commit log (``core.log``), worked out as the
    writer takes it."""

    node: str
    #: the cohort version its signals were matched against (and its own changes decided
    #: against), and after its own changes: it commits only if the database's is ``before``
    before: int
    after: int
    applied: int  # the last id this node had applied: the transaction reads those after
    #: encoded by the transaction (``core.log``): empty for a batch of signals only
    record: bytes = b""
    id: int = 0  # given in the transaction
    #: the log's rows (``core.log.Row``) between ``applied`` and this one, read in the
    #: transaction
    earlier: list[tuple[Any, ...]] = field(default_factory=list)
    #: set once a commit found the cohorts changed under it: the transaction takes the
    #: head first, and gives this the log's rows past ``applied`` (``replica.rematch``)
    catch_up: Callable[[list[tuple[Any, ...]]], None] | None = None


@dataclass(slots=True)
class Batch:
    first_seq: int
    ledger: list[Row] = field(default_factory=list)
    board: list[Contribution] = field(default_factory=list)  # on the board once committed
    #: reads of the tables, made by the writer before this batch's writes
    reads: list[HistoryRead | LeftRead] = field(default_factory=list)
    memberships: dict[int, tuple[bool, int]] = field(default_factory=dict)
    cohorts: dict[str, Cohort | None] = field(default_factory=dict)
    #: the ids of the cohorts those changes replaced: their tallies leave the board once this
    #: batch commits. Not the cohorts missing from the registry then: a batch read after
    #: this one may have changed it, and may yet be refused
    cohorts_gone: list[int] = field(default_factory=list)
    next_cohort_id: int | None = None
    #: a checkpoint: the board's tallies changed since the last, and those gone. The
    #: writer writes them as the board holds them, all committed before this batch (the
    #: board holds only what is committed, and takes nothing in while this commits)
    board_state: Board | None = None
    board_changed: Changed | None = None
    shelf: Shelf | None = None  # what is on disk of the board
    decay: list[tuple[int, int]] = field(default_factory=list)  # the board's, for the writer
    now_ns: int = 0  # when the writer took it: which buckets are still kept
    users_blocks: list[tuple[int, bytes]] = field(default_factory=list)  # see userrows.py
    #: idempotency keys: key -> (seq, forwarded, ts_ns, user). One entry per key, the last use:
    #: a key can be used twice in one batch (its first use erased, or past the window or the
    #: cap), and one upsert statement may not write a row twice
    keys: dict[str, tuple[int, bool, int, int | None]] = field(default_factory=dict)
    forget_keys_before: int | None = None  # ts_ns: keys older than this leave the table
    past: list[Withdrawal] = field(default_factory=list)  # purges and erases, in order
    rewrite: Rewrite | None = None  # a chunk of the rows of withdrawals before
    history: list[Event] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)  # the change feed's events, in order
    feed_reads: list[FeedRead] = field(default_factory=list)  # pages subscribers replay
    groups: GroupWrites | None = None  # the consumer groups' (``engine.consumers``)
    #: feed retention: (events before at_ns, through this id at most; see ``engine.publisher``)
    retire_events: tuple[int, int] | None = None
    retire: tuple[int, int] | None = None  # ledger retention: (rows before ts_ns, at most)
    retire_ranges: bool = False  # ... cluster mode: in each node's range of seqs
    reach: bool = False  # a health check: the writer reaches the database, even with no writes
    probe: bool = False  # a write that tests the disk, for a health check after a full disk
    replies: list[tuple[Replier, int | None, Any]] = field(default_factory=list)
    writers: set[Replier] = field(default_factory=set)  # connections with a write here
    undo: list[Undo] = field(default_factory=list)
    #: cluster mode: the partitions this batch writes for -> the epoch this node holds each
    #: at; its transaction commits only if the database still has them (``core.owners``)
    parts: dict[int, int] = field(default_factory=dict)
    #: cluster mode: this batch's record in the commit log (``core.log``)
    log: Entry | None = None
    #: ... and its defines and drops of cohorts, decided again if another change comes
    #: first (``rematch``)
    asks: list[CohortAsk] = field(default_factory=list)
    committed: bool = False  # set as the writer hands it over, durable
    writes: int = 0
    signals: int = 0
    fanout: int = 0  # cohort and community aggregates added to
    growth: int = 0  # bytes of the aggregates it creates: the budget's ``pending``
    #: the aggregates it creates, those not on the board (``budget.grows``)
    creating: set[tuple[str, str, Key]] = field(default_factory=set)
    forwarded: int = 0
    leaves: int = 0
    rejoins: int = 0

    def pending(self) -> bool:
        return bool(
            self.writes
            or self.replies
            or self.reads
            or self.feed_reads
            or self.board_changed is not None
            or self.retire is not None
            or self.retire_events is not None
            or self.rewrite is not None
            or self.groups is not None
        )

    def group_writes(self) -> GroupWrites:
        if self.groups is None:
            self.groups = GroupWrites()
        return self.groups

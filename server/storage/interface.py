"""Storage, as the engine sees it: one small interface, two backends.

``--db`` names a SQLite file (``sqlite``, the embedded default) or a
``postgresql://`` URL (``postgres``); ``backends`` opens the one it names. Both run
the same plans (``plans``) and keep the same promises: a batch is one
transaction, and ``commit`` returns only once it is durable, or raises
``StorageFailure``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tidal.server.core.batch import Batch


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the server needs in memory before it accepts a connection."""

    #: users who have left, and users who left once and rejoined: user_id -> left_at_ns
    left: dict[int, int]
    rejoined: dict[int, int]
    cohorts: list[tuple[int, str, Any]]
    next_seq: int
    next_cohort_id: int
    #: the aggregates and buckets tables hold every signal up to this seq
    watermark: int
    #: seq, entity, kind, weight, forwarded, context, at_ns: every row past the watermark
    ledger_tail: list[tuple[int, str, str, float, int, bytes | None, int]]
    #: idempotency key -> (seq, forwarded, ts_ns), oldest first
    keys: OrderedDict[str, tuple[int, bool, int]]
    ledger_rows: int
    last_event_ns: int  # the latest event in any user's history
    next_block: int  # the first seq that no block of ledger_users lists yet
    users_tail: list[int]  # the users of the rows from there on, in seq order
    board: BoardRows


@dataclass(slots=True)
class BoardRows:
    """The board as the database holds it, for ``core.restore`` (see ``buckets``)."""

    decay: list[tuple[int, int]]  # (half-life s, base ns) of each trend (``core.windows``)
    next_tally_id: int
    chunks: list[tuple[int, bytes, bytes]] = field(default_factory=list)  # newest first
    parts: list[tuple[int, int, bytes]] = field(default_factory=list)  # in order
    #: half-lives some chunk lacks: their decayed sums come from the ledger (``trends``)
    missing: list[int] = field(default_factory=list)
    trends: list[tuple[Any, ...]] = field(default_factory=list)
    #: the row tables of before, if they hold the board (read once, then written as chunks)
    aggregates: list[tuple[str, int, int, str, str, int, float]] = field(default_factory=list)
    buckets: list[tuple[str, int, int, str, str, int, int, int, float]] = field(
        default_factory=list
    )
    #: what purges and erases took off since the board was written, to take off it:
    #: (aggregates rows, buckets rows), oldest first
    withdrawn: list[tuple[list[Any], list[Any]]] = field(default_factory=list)


class Storage(Protocol):
    #: "sqlite" or "postgresql", for ``stats`` and the metrics
    backend: str
    #: where it is, safe to log (a URL's password is left out)
    location: str
    commits: int  # transactions committed since boot

    async def load(
        self, keys_since_ns: int, max_keys: int, half_lives: Sequence[int], now_ns: int
    ) -> Snapshot:
        """Everything the engine keeps in memory; called once, before serving."""

    async def commit(self, batch: Batch) -> None:
        """The batch's reads, then its writes in one transaction; raises ``StorageFailure``
        if it did not commit (and only then), or ``CommitUnknown`` if the answer to its
        COMMIT was lost (PostgreSQL)."""

    def size(self) -> int:
        """Bytes the database takes (PostgreSQL: as last measured)."""

    async def close(self) -> None: ...


def is_url(db: str) -> bool:
    return db.startswith(("postgresql://", "postgres://"))

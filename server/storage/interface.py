"""Storage, as the engine sees it: one small interface, two backends.

``--db`` names a SQLite file (``sqlite``, the embedded default) or a
``postgresql://`` URL (``postgres``); ``backends`` opens the one it names. Both run
the same plans (``plans``, composed by ``engine.cycle``) and keep the same promises: a batch is one
transaction, and ``commit`` returns only once it is durable, or raises
``StorageFailure``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from tidal.server.core.restore import BoardRows
from tidal.server.core.rewrites import Rule
from tidal.server.storage.sqlbulk import Dialect, Plan

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the server needs in memory before it accepts a connection."""

    #: users who have left, and users who left once and rejoined: user_id -> left_at_ns
    left: dict[int, int]
    rejoined: dict[int, int]
    cohorts: list[tuple[int, str, Any]]
    next_seq: int
    next_cohort_id: int
    #: the board on disk holds every signal up to this seq
    watermark: int
    #: seq, entity, kind, weight, forwarded, context, at_ns: every row past the watermark
    ledger_tail: list[tuple[int, str, str, float, int, bytes | None, int]]
    #: idempotency key -> (seq, forwarded, ts_ns), oldest first
    keys: OrderedDict[str, tuple[int, bool, int, int | None]]
    ledger_rows: int
    last_event_ns: int  # the latest event in any user's history, or the change feed
    next_block: int  # the first seq that no block of ledger_users lists yet
    users_tail: list[int]  # the users of the rows from there on, in seq order
    board: BoardRows
    last_event_id: int  # the change feed's: the last id given
    #: withdrawals whose rows are not all rewritten yet: user as stored -> rule
    rules: dict[int, Rule]
    #: the consumer groups (``storage.groups_sql.load``)
    groups: list[Any] = field(default_factory=list)


class Storage(Protocol):
    #: "sqlite" or "postgresql", for ``stats`` and the metrics
    backend: str
    #: where it is, safe to log (a URL's password is left out)
    location: str
    commits: int  # transactions committed since boot
    #: seconds without a commit after which the writer calls ``probe``; None: never
    probe_every: float | None

    async def load(
        self, keys_since_ns: int, max_keys: int, half_lives: Sequence[int], now_ns: int
    ) -> Snapshot:
        """Everything the engine keeps in memory; called once, before serving."""

    async def commit(self, transaction: Callable[[Dialect], Plan[bool]]) -> None:
        """A batch's reads, then its writes in one transaction (``engine.cycle``: True if
        it committed one); raises ``StorageFailure`` if it did not commit (and only then),
        or ``CommitUnknown`` if the answer to its COMMIT was lost (PostgreSQL)."""

    async def read(self, plan: Callable[[Dialect], Plan[T]]) -> T:
        """A plan of reads, beside the writer: on a connection of its own, in one read
        transaction (a snapshot of what is committed); raises ``StorageFailure``."""

    async def probe(self) -> None:
        """A round trip to the database, by the writer while it has nothing to commit;
        raises ``StorageFailure`` as a commit would."""

    def size(self) -> int:
        """Bytes the database takes (PostgreSQL: as last measured)."""

    async def close(self) -> None: ...


def is_url(db: str) -> bool:
    return db.startswith(("postgresql://", "postgres://"))

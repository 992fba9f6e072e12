"""SQL shared by both backends, and the statements a plan asks its backend to run.

A plan (``plans``, ``storage_past``) is a generator: it yields statements and is
sent their results, as h11 takes bytes and gives events. It does no I/O, so the
order of a commit's statements is written once, and SQLite runs it all in one
call on its thread while PostgreSQL awaits each statement on its connection.
SQL is written with ``?`` placeholders; the PostgreSQL runner numbers them.
Both databases hold user ids (unsigned 64-bit on the wire) as signed 64-bit, in
two's complement (``core.ledger.to_db``, ``from_db``).
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple, NoReturn, TypeAlias, TypeVar

from tidal.server.core.ledger import I64_MAX as I64_MAX  # the rule's one place
from tidal.server.core.ledger import U64 as U64
from tidal.server.core.ledger import from_db as from_db
from tidal.server.core.ledger import to_db as to_db

log = logging.getLogger("tidal.storage")


T = TypeVar("T")


class Bulk(NamedTuple):
    """A write of many rows: ``head`` + the rows + ``tail``. SQLite gives the rows as
    ``VALUES`` lists, PostgreSQL as one array per column, typed by ``types``."""

    head: str
    types: tuple[str, ...]
    tail: str = ""
    #: what each column stores, ``?`` standing for its value, where not the value itself
    values: tuple[str, ...] = ()


def unnested(bulk: Bulk) -> str:
    """PostgreSQL's form of a ``Bulk``: one array per column, unnested side by side, in one
    statement (``?`` placeholders, one per column)."""
    arrays = ", ".join(f"?::{kind}[]" for kind in bulk.types)
    if not bulk.values:
        return f"{bulk.head} SELECT * FROM unnest({arrays}){bulk.tail}"
    names = [f"c{i}" for i in range(1, len(bulk.types) + 1)]
    select = ", ".join(v.replace("?", name) for v, name in zip(bulk.values, names, strict=True))
    return f"{bulk.head} SELECT {select} FROM unnest({arrays}) AS t({', '.join(names)}){bulk.tail}"


# -- what a plan yields; each is answered with its result -------------------


class Exec(NamedTuple):
    """A statement; answered with None."""

    sql: str
    args: tuple[Any, ...] = ()


class Rows(NamedTuple):
    """A query; answered with its rows, as tuples."""

    sql: str
    args: tuple[Any, ...] = ()


class Changed(NamedTuple):
    """A statement; answered with the number of rows it changed."""

    sql: str
    args: tuple[Any, ...] = ()


class Many(NamedTuple):
    """One statement per row of arguments; answered with None."""

    sql: str
    rows: Sequence[tuple[Any, ...]]


class Put(NamedTuple):
    """Many rows in as few statements as the backend can; answered with None."""

    bulk: Bulk
    rows: Sequence[tuple[Any, ...]]


class Try(NamedTuple):
    """``Put``, in a savepoint: answered with None if the rows were written, or with the
    database's reason if it refused them for their data (a value it cannot store: see
    ``put_guarded``), the savepoint then rolled back and the transaction going on. Any other
    failure fails the transaction, as a ``Put``'s does."""

    bulk: Bulk
    rows: Sequence[tuple[Any, ...]]


class Begin(NamedTuple):
    """A write transaction: SQLite takes its write lock at once (``BEGIN IMMEDIATE``)."""


class Commit(NamedTuple):
    """The end of the transaction. ``batch_id``: written in it, so that a commit whose
    answer was lost can be found out (PostgreSQL; SQLite answers in process)."""

    batch_id: int | None = None


class Fill(NamedTuple):
    """A query of (key, value) rows, put straight into ``into`` (the boot's large maps,
    with no list of rows between); answered with None."""

    sql: str
    args: tuple[Any, ...]
    into: dict[Any, Any]


class Turn(NamedTuple):
    """A turn of the event loop for everyone else, amid a long computation of the plan's
    own: PostgreSQL runs plans on the loop (SQLite, in a thread of their own, goes on at
    once); answered with None."""


Op: TypeAlias = Exec | Rows | Changed | Many | Put | Try | Fill | Begin | Commit | Turn
Plan: TypeAlias = Generator[Op, Any, T]


def unknown(op: NoReturn) -> NoReturn:
    """A runner's last branch, after one per kind of ``Op``: mypy refuses a runner that
    leaves a kind out (``op`` is not ``NoReturn`` then), and at run time an operation of no
    known kind raises, and the transaction it is in rolls back rather than commits."""
    raise TypeError(f"a plan yielded {op!r}, which is no kind of storage operation")


@dataclass(frozen=True, slots=True)
class Dialect:
    """What the two backends spell differently in a plan: a list of integers given as one
    argument (SQLite: a JSON array read by ``json_each``; PostgreSQL: an array)."""

    in_list: str  # "{column} IN ..." with one placeholder
    json_seqs: bool
    table: str  # the list as a table: "(SELECT ... AS {column} ...)" with one placeholder

    def among(self, column: str) -> str:
        """``column`` is one of the list given as the placeholder's argument (``seqs``)."""
        return self.in_list.format(column=column)

    @property
    def in_seqs(self) -> str:
        return self.among("seq")

    def listed(self, column: str) -> str:
        """The list given as the placeholder's argument, as a table of one ``column``."""
        return self.table.format(column=column)

    def seqs(self, seqs: list[int]) -> Any:
        return "[" + ",".join(map(str, seqs)) + "]" if self.json_seqs else seqs


SQLITE: Final = Dialect(
    "{column} IN (SELECT value FROM json_each(?))",
    json_seqs=True,
    table="(SELECT value AS {column} FROM json_each(?))",
)
POSTGRES: Final = Dialect(
    "{column} = ANY(?::bigint[])",
    json_seqs=False,
    table="(SELECT unnest(?::bigint[]) AS {column})",
)

# -- statements both run as written ----------------------------------------

#: ``aggregates`` keys an aggregate by (layer, cohort, name): a cohort by its id, a
#: community by its name, the ledger layer by neither. Two typed columns keep one order,
#: the engine's, in both databases: ids as numbers, names byte by byte.
AGGREGATES: Final = Bulk(
    "INSERT INTO aggregates (entity, layer, cohort, name, kind, count, weight)",
    ("text", "smallint", "bigint", "text", "text", "bigint", "float8"),
    " ON CONFLICT (entity, layer, cohort, name, kind) DO UPDATE SET"
    " count = aggregates.count + excluded.count, weight = aggregates.weight + excluded.weight",
)
#: cluster mode: the commit log's head, the row every commit that writes the log, and every
#: write of a block of ``ledger_users`` (``log_sql._LOCK_ORDER``), holds to its COMMIT
HEAD_LOCK: Final = "SELECT log_id FROM tidal_cluster FOR UPDATE"
SET_META: Final = (
    "INSERT INTO meta (key, value) VALUES (?, ?)"
    " ON CONFLICT (key) DO UPDATE SET value = excluded.value"
)
ADD_META: Final = (
    "INSERT INTO meta (key, value) VALUES (?, ?)"
    " ON CONFLICT (key) DO UPDATE SET value = meta.value + excluded.value"
)
WATERMARK: Final = "SELECT value FROM meta WHERE key = 'aggregates_seq'"
#: the ledger as it counts: through the rules of withdrawals whose rows are not all
#: rewritten yet (``core.rewrites``), in both schemas
LEDGER_COUNTED: Final = """CREATE VIEW ledger_counted AS
    SELECT l.seq, l.user_id, l.entity, l.kind, l.weight, l.ts_ns,
        CASE WHEN l.seq < r.purge_before THEN 0 ELSE l.forwarded END AS forwarded,
        l.context, l.at_ns
    FROM ledger l LEFT JOIN rewrites r ON r.user_id = l.user_id
    WHERE r.erase_before IS NULL OR l.seq >= r.erase_before"""


def put_guarded(
    bulk: Bulk, rows: Sequence[tuple[Any, ...]]
) -> Plan[list[tuple[tuple[Any, ...], str]]]:
    """Rows in, but for those the database refuses for their data, found by halves and
    left out: each with the reason. One statement when every row is storable."""
    if not rows:
        return []
    reason = yield Try(bulk, rows)
    if reason is None:
        return []
    if len(rows) == 1:
        return [(rows[0], reason)]
    half = len(rows) // 2
    refused = yield from put_guarded(bulk, rows[:half])
    return refused + (yield from put_guarded(bulk, rows[half:]))


def put_aggregates(rows: Sequence[tuple[Any, ...]]) -> Plan[None]:
    """Aggregates rows added, in the row tables of before (``storage.buckets``). One the
    database cannot store (a name written before tidal refused NUL, on PostgreSQL) is left
    out and logged, rather than fail every checkpoint after it: the ledger keeps the rows
    it came from."""
    for row, reason in (yield from put_guarded(AGGREGATES, rows)):
        entity, layer, cohort, name, kind, count, _ = row
        log.error(
            "an aggregate the database cannot store is left out (%s): entity %r, layer %d,"
            " cohort %d, name %r, kind %r, %+d signals",
            reason, entity, layer, cohort, name, kind, count,
        )  # fmt: skip


def table_watermark() -> Plan[int]:
    rows = yield Rows(WATERMARK)
    return int(rows[0][0]) if rows else 0

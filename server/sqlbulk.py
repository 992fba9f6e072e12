"""SQL shared by the storage modules: many rows in one statement, user ids as SQLite holds
them, aggregates rows, the meta table."""

from __future__ import annotations

import functools
import itertools
import sqlite3
from collections.abc import Sequence
from typing import Any, Final, NamedTuple

from .aggregates import Deltas

U64: Final = 2**64
I64_MAX: Final = 2**63 - 1


class Bulk(NamedTuple):
    """A write of many rows: ``head`` + rows of ``width`` placeholders + ``tail``."""

    head: str
    width: int
    tail: str = ""


AGGREGATES: Final = Bulk(
    "INSERT INTO aggregates (entity, layer, key, kind, count, weight) VALUES ",
    6,
    " ON CONFLICT DO UPDATE SET count = count + excluded.count, weight = weight + excluded.weight",
)
BULK_ROWS: Final = 512  # rows per statement: 512 x 8 parameters, well under SQLite's 32766
SET_META: Final = "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)"


def to_db(user_id: int) -> int:
    return user_id - U64 if user_id > I64_MAX else user_id


def from_db(value: int) -> int:
    return value + U64 if value < 0 else value


def rows_of(deltas: Deltas) -> list[tuple[Any, ...]]:
    return [
        (entity, layer, key, kind, count, weight)
        for entity, slots in deltas.items()
        for (layer, key, kind), (count, weight) in slots.items()
        if count
    ]


def write_all(db: sqlite3.Connection, bulk: Bulk, rows: Sequence[tuple[Any, ...]]) -> None:
    """``executemany`` without its cost here: it binds and steps one row at a time and
    takes the GIL back for every row, and with the event loop busy each of those is a
    wait (measured: 84-265 ms for 128 ledger rows, against 14 ms in one statement).
    Rows go in statements of a power-of-two size, so a handful of shapes stay cached."""
    done, total = 0, len(rows)
    while done < total:
        size = min(BULK_ROWS, 1 << ((total - done).bit_length() - 1))
        flat = list(itertools.chain.from_iterable(rows[done : done + size]))
        db.execute(_statement(bulk, size), flat)
        done += size


@functools.lru_cache(maxsize=128)
def _statement(bulk: Bulk, rows: int) -> str:
    row = "(" + ", ".join("?" * bulk.width) + ")"
    return bulk.head + ", ".join([row] * rows) + bulk.tail


def table_watermark(db: sqlite3.Connection) -> int:
    row = db.execute("SELECT value FROM meta WHERE key = 'aggregates_seq'").fetchone()
    return int(row[0]) if row else 0

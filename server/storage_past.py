"""The SQL of a user's past: purge, erase, history, left users, retention, and the blocks
of ``ledger_users`` that say where each user's rows are (``userrows``)."""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from typing import Final

from . import past, userrows
from .batch import Batch
from .sqlbulk import AGGREGATES, I64_MAX, Bulk, from_db, rows_of, to_db, write_all

log = logging.getLogger("tidal.storage")

HISTORY: Final = Bulk("INSERT INTO history (user_id, at_ns, event, signals) VALUES ", 4)
SELECT_HISTORY: Final = """
    SELECT at_ns, event, signals FROM history
    WHERE user_id = ? AND at_ns > ? ORDER BY at_ns LIMIT ?"""
# Left users in unsigned order: ids below 2**63 (stored as they are), then those above
# (stored negative)
_SELECT_LEFT: Final = """
    SELECT user_id, left_at_ns FROM memberships
    WHERE left = 1 AND user_id BETWEEN ? AND ? ORDER BY user_id LIMIT ?"""
# a user's rows, by seq: given as one JSON array, so that one statement takes them all
_SEQS: Final = "seq IN (SELECT value FROM json_each(?)) AND user_id = ?"
_PURGE: Final = f"""
    UPDATE ledger SET forwarded = 0 WHERE {_SEQS} AND forwarded = 1
    RETURNING seq, entity, kind, weight, 1, context"""
_ERASE: Final = f"""
    DELETE FROM ledger WHERE {_SEQS}
    RETURNING seq, entity, kind, weight, forwarded, context"""
_ERASE_KEYS: Final = """
    DELETE FROM signal_keys WHERE seq IN (SELECT value FROM json_each(?)) RETURNING key, seq"""
_BLOCKS: Final = "SELECT first_seq, users FROM ledger_users WHERE first_seq < ?"
PUT_BLOCK: Final = "INSERT OR REPLACE INTO ledger_users (first_seq, users) VALUES (?, ?)"
_RETIRE_BLOCKS: Final = """
    DELETE FROM ledger_users WHERE first_seq IN (
        SELECT first_seq FROM ledger_users WHERE first_seq <= ? LIMIT ?)"""
_RETIRE: Final = """
    DELETE FROM ledger WHERE seq IN (
        SELECT seq FROM ledger WHERE seq <= ? AND ts_ns < ? ORDER BY seq LIMIT ?)"""


def left_users(db: sqlite3.Connection, after: int | None, n: int) -> list[tuple[int, int]]:
    """The first ``n`` Left users past ``after``, in unsigned user_id order."""
    start = 0 if after is None else after + 1
    if start <= I64_MAX:
        ranges = [(start, I64_MAX), (-I64_MAX - 1, -1)]
    else:  # only ids of 2**63 and above are left (past the last id: an empty range)
        ranges = [(to_db(start), -1)]
    rows: list[tuple[int, int]] = []
    for low, high in ranges:
        for uid, at in db.execute(_SELECT_LEFT, (low, high, n - len(rows))):
            rows.append((from_db(uid), at))
        if len(rows) >= n:
            break
    return rows


def withdraw(db: sqlite3.Connection, w: past.Withdrawal, watermark: int, first_seq: int) -> None:
    """A purge or an erase: change the user's rows, and take what they added off the
    table now (rows up to ``watermark``) and off memory once committed (the rest)."""
    began = time.perf_counter()
    user = to_db(w.user_id)
    blocks, seqs = _seqs_of(db, w, user, first_seq)
    listed = json.dumps(seqs)
    if w.erase:
        w.keys = db.execute(_ERASE_KEYS, (listed,)).fetchall()
        for first, (block, mine) in blocks.items():  # no trace of the user in the blocks
            db.execute(PUT_BLOCK, (first, userrows.blank(block, first, mine)))
    w.take(db.execute(_ERASE if w.erase else _PURGE, (listed, user)).fetchall(), watermark)
    if w.table:
        write_all(db, AGGREGATES, rows_of(w.table))
        db.executemany(
            "DELETE FROM aggregates WHERE entity = ? AND count = 0", [(e,) for e in w.table]
        )
    w.seconds = time.perf_counter() - began


def _seqs_of(
    db: sqlite3.Connection, w: past.Withdrawal, user: int, first_seq: int
) -> tuple[dict[int, tuple[bytes, list[int]]], list[int]]:
    """The user's rows read before ``w``: in the blocks of ``ledger_users`` (returned too,
    those that list the user, with where), in memory past them (``w.recent``), and in
    this batch."""
    blocks = {}
    seqs = set(w.recent)
    for first, block in db.execute(_BLOCKS, (w.before_seq,)):
        mine = userrows.find(block, first, user)
        if mine:
            blocks[first] = (block, mine)
            seqs.update(mine)
    in_batch = "SELECT seq FROM ledger WHERE seq >= ? AND seq < ? AND user_id = ?"
    seqs.update(seq for (seq,) in db.execute(in_batch, (first_seq, w.before_seq, user)))
    return blocks, sorted(seq for seq in seqs if seq < w.before_seq)


def catch_up_blocks(db: sqlite3.Connection, next_seq: int) -> tuple[int, list[int]]:
    """Write the blocks of ``ledger_users`` that rows already written fill (a database
    from before the table, or rows committed since the last block); the users past them."""
    ((last,),) = db.execute("SELECT MAX(first_seq) FROM ledger_users")
    start = 1 if last is None else last + userrows.BLOCK
    rows = "SELECT seq, user_id FROM ledger WHERE seq >= ? AND seq < ? ORDER BY seq"

    def users(first: int, end: int) -> list[int]:
        listed = dict(db.execute(rows, (first, end)).fetchall())
        return [listed.get(seq, 0) for seq in range(first, end)]  # an erased row: 0

    blocks = 0
    db.execute("BEGIN IMMEDIATE")
    try:
        while start + userrows.BLOCK <= next_seq:
            block = userrows.pack(users(start, start + userrows.BLOCK))
            db.execute(PUT_BLOCK, (start, block))
            start += userrows.BLOCK
            blocks += 1
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    if blocks > 1:
        log.info("listed the users of %d ledger rows in ledger_users", blocks * userrows.BLOCK)
    return start, users(start, next_seq)


def retire(db: sqlite3.Connection, batch: Batch, watermark: int) -> None:
    """A chunk of ledger retention; then the blocks of ``ledger_users`` no row is left in."""
    assert batch.retire is not None
    before_ns, most = batch.retire
    batch.retired = db.execute(_RETIRE, (watermark, before_ns, most)).rowcount
    ((first,),) = db.execute("SELECT MIN(seq) FROM ledger")
    first = first if first is not None else watermark + 1
    db.execute(_RETIRE_BLOCKS, (first - userrows.BLOCK, most))

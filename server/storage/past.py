"""The SQL of a user's past: purge, erase, history, left users, retention, and the blocks
of ``ledger_users`` that say where each user's rows are (``userrows``)."""

from __future__ import annotations

import logging
import time
from typing import Final

from tidal.server.core import past, userrows
from tidal.server.core.batch import Batch

from . import buckets
from .sqlbulk import (
    I64_MAX,
    Begin,
    Bulk,
    Changed,
    Commit,
    Dialect,
    Exec,
    Plan,
    Rows,
    from_db,
    to_db,
)

log = logging.getLogger("tidal.storage")

HISTORY: Final = Bulk(
    "INSERT INTO history (user_id, at_ns, event, signals)",
    ("bigint", "bigint", "smallint", "bigint"),
)
SELECT_HISTORY: Final = """
    SELECT at_ns, event, signals FROM history
    WHERE user_id = ? AND at_ns > ? ORDER BY at_ns LIMIT ?"""
# Left users in unsigned order: ids below 2**63 (stored as they are), then those above
# (stored negative)
_SELECT_LEFT: Final = """
    SELECT user_id, left_at_ns FROM memberships
    WHERE "left" = 1 AND user_id BETWEEN ? AND ? ORDER BY user_id LIMIT ?"""
_BLOCKS: Final = "SELECT first_seq, users FROM ledger_users"
PUT_BLOCK: Final = (
    "INSERT INTO ledger_users (first_seq, users) VALUES (?, ?)"
    " ON CONFLICT (first_seq) DO UPDATE SET users = excluded.users"
)
_RETIRE_BLOCKS: Final = """
    DELETE FROM ledger_users WHERE first_seq IN (
        SELECT first_seq FROM ledger_users WHERE first_seq <= ? ORDER BY first_seq LIMIT ?)"""
# the oldest rows, in seq order, that are old enough: a pass reads at most a chunk of rows,
# and none past the first row still young (times follow seqs, but for a clock stepped back)
_OLDEST: Final = "SELECT ts_ns FROM ledger ORDER BY seq LIMIT 1"
_RETIRE: Final = """
    DELETE FROM ledger WHERE seq IN (
        SELECT seq FROM ledger WHERE seq <= ? ORDER BY seq LIMIT ?) AND ts_ns < ?"""


def left_users(after: int | None, n: int) -> Plan[list[tuple[int, int]]]:
    """The first ``n`` Left users past ``after``, in unsigned user_id order."""
    start = 0 if after is None else after + 1
    if start <= I64_MAX:
        ranges = [(start, I64_MAX), (-I64_MAX - 1, -1)]
    else:  # only ids of 2**63 and above are left (past the last id: an empty range)
        ranges = [(to_db(start), -1)]
    rows: list[tuple[int, int]] = []
    for low, high in ranges:
        for uid, at in (yield Rows(_SELECT_LEFT, (low, high, n - len(rows)))):
            rows.append((from_db(uid), at))
        if len(rows) >= n:
            break
    return rows


def read_blocks() -> Plan[dict[int, bytes]]:
    """Every block of ``ledger_users``, read once for all the withdrawals of a batch."""
    return dict((yield Rows(_BLOCKS)))


def withdraw(
    d: Dialect,
    w: past.Withdrawal,
    watermark: int,
    blocks: dict[int, bytes],
    batch: Batch,
) -> Plan[None]:
    """A purge or an erase: change the user's rows, and take what they added off the
    tables now (rows up to ``watermark``) and off the board once committed (all). A user
    with no rows costs a search of ``blocks`` and no statement."""
    began = time.perf_counter()
    user = to_db(w.user_id)
    mine_by_block = {}
    seqs = set(w.recent)
    for first, block in blocks.items():
        if first < w.before_seq and (found := userrows.find(block, first, user)):
            mine_by_block[first] = found
            seqs.update(found)
    listed = sorted(seq for seq in seqs if seq < w.before_seq)
    if listed:
        yield from _withdraw_rows(d, w, user, d.seqs(listed), watermark)
        yield from buckets.withdraw(w.board_table, batch.decay, batch.now_ns)
        if w.erase:
            for first, found in mine_by_block.items():  # no trace of the user in the blocks
                blocks[first] = userrows.blank(blocks[first], first, found)
                yield Exec(PUT_BLOCK, (first, blocks[first]))
    w.seconds = time.perf_counter() - began


def _withdraw_rows(
    d: Dialect, w: past.Withdrawal, user: int, listed: object, watermark: int
) -> Plan[None]:
    mine = f"{d.in_seqs} AND user_id = ?"  # a user's rows, by seq, in one argument
    if w.erase:
        erase_keys = f"DELETE FROM signal_keys WHERE {d.in_seqs} RETURNING key, seq"
        w.keys = yield Rows(erase_keys, (listed,))
        query = (
            f"DELETE FROM ledger WHERE {mine}"
            " RETURNING seq, entity, kind, weight, forwarded, context, COALESCE(at_ns, ts_ns)"
        )
    else:
        query = (
            f"UPDATE ledger SET forwarded = 0 WHERE {mine} AND forwarded = 1"
            " RETURNING seq, entity, kind, weight, 1, context, COALESCE(at_ns, ts_ns)"
        )
    w.take((yield Rows(query, (listed, user))), watermark)


def catch_up_blocks(next_seq: int) -> Plan[tuple[int, list[int]]]:
    """Write the blocks of ``ledger_users`` that rows already written fill (a database
    from before the table, or rows committed since the last block); the users past them."""
    ((last,),) = yield Rows("SELECT MAX(first_seq) FROM ledger_users")
    if last is not None:
        start = last + userrows.BLOCK
    else:  # none yet, or retention has taken them all: from the block of the oldest kept row
        ((oldest,),) = yield Rows("SELECT MIN(seq) FROM ledger")
        start = userrows.block_of(next_seq if oldest is None else oldest)
    rows = "SELECT seq, user_id FROM ledger WHERE seq >= ? AND seq < ? ORDER BY seq"

    def users(first: int, end: int) -> Plan[list[int]]:
        listed = dict((yield Rows(rows, (first, end))))
        return [listed.get(seq, 0) for seq in range(first, end)]  # an erased row: 0

    blocks = 0
    if start + userrows.BLOCK <= next_seq:
        yield Begin()
        while start + userrows.BLOCK <= next_seq:
            block = userrows.pack((yield from users(start, start + userrows.BLOCK)))
            yield Exec(PUT_BLOCK, (start, block))
            start += userrows.BLOCK
            blocks += 1
        yield Commit()
    if blocks > 1:
        log.info("listed the users of %d ledger rows in ledger_users", blocks * userrows.BLOCK)
    return start, (yield from users(start, next_seq))


def retire(batch: Batch, watermark: int) -> Plan[None]:
    """A chunk of ledger retention; then the blocks of ``ledger_users`` no row is left in."""
    assert batch.retire is not None
    before_ns, most = batch.retire
    oldest = yield Rows(_OLDEST)
    if not oldest or oldest[0][0] >= before_ns:  # nothing is old enough: one row read
        batch.retired = 0
        return
    batch.retired = yield Changed(_RETIRE, (watermark, most, before_ns))
    ((first,),) = yield Rows("SELECT MIN(seq) FROM ledger")
    first = first if first is not None else watermark + 1
    yield Changed(_RETIRE_BLOCKS, (first - userrows.BLOCK, most))

"""The SQL of a user's past: purge, erase, history, left users, retention, and the blocks
of ``ledger_users`` that say where each user's rows are (``userrows``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Final

from tidal.server.core import past, userrows
from tidal.server.core.batch import Batch
from tidal.server.core.rewrites import Rewrite, Rewritten, Rule

from . import buckets
from .sqlbulk import (
    ADD_META,
    I64_MAX,
    Begin,
    Bulk,
    Changed,
    Commit,
    Dialect,
    Exec,
    Plan,
    Rows,
    Turn,
    from_db,
    table_watermark,
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


def count_left(d: Dialect) -> Plan[int]:
    """How many users are Left, as committed (``count_left``, on the reader)."""
    ((n,),) = yield Rows('SELECT COUNT(*) FROM memberships WHERE "left" = 1')
    return int(n)


_ROWS_OF: Final = (
    "SELECT seq, entity, kind, weight, forwarded, context, COALESCE(at_ns, ts_ns) FROM ledger"
    " WHERE {in_seqs} AND user_id = ? ORDER BY seq"
)
_PUT_RULE: Final = (
    "INSERT INTO rewrites (user_id, purge_before, erase_before) VALUES (?, ?, ?)"
    " ON CONFLICT (user_id) DO UPDATE SET purge_before = excluded.purge_before,"
    " erase_before = excluded.erase_before"
)


#: blocks searched between two turns of the loop for everyone else (``Turn``): 65,536
#: rows, a few ms for many users at once
TURN_BLOCKS: Final = 16


def _found(blocks: list[tuple[int, bytes]], users: set[int]) -> Plan[dict[int, list[int]]]:
    """``userrows.find_all``, a few blocks a turn: on PostgreSQL the search runs on the
    loop, and a survey of a million-row ledger took everyone's turn for 35 ms at once."""
    found: dict[int, list[int]] = {}
    for at in range(0, len(blocks), TURN_BLOCKS):
        if at:
            yield Turn()
        for user, seqs in userrows.find_all(blocks[at : at + TURN_BLOCKS], users).items():
            found.setdefault(user, []).extend(seqs)
    return found


def _rows_of(d: Dialect, user: int, seqs: list[int]) -> Plan[list[past.PastRow]]:
    if not seqs:
        return []
    rows: list[past.PastRow] = yield Rows(_ROWS_OF.format(in_seqs=d.in_seqs), (d.seqs(seqs), user))
    return rows


def survey(
    d: Dialect,
    ws: list[past.Withdrawal],
    decay: Sequence[tuple[int, int]],
    now_ns: int,
    through: int | None = None,
) -> Plan[list[past.Survey]]:
    """Withdrawals' rows that the snapshot's blocks list, and what they take off: run on
    the reader, in one read transaction, beside the writer. The blocks are read once.

    They are the rows below ``through``: past the last block by default; in cluster mode,
    where each commit writes its own block (``userrows.runs``), merged later, the first seq
    not committed when the survey was asked for, so that the writer finds the rest
    (``withdraw``), though other nodes' blocks lie above and below. A merged block may
    reach past ``through``: its rows there are the writer's to find."""
    if through is None:
        ((last,),) = yield Rows("SELECT MAX(first_seq) FROM ledger_users")
        through = 0 if last is None else last + userrows.BLOCK
    watermark = yield from table_watermark()
    blocks = yield Rows(_BLOCKS + " WHERE first_seq < ?", (through,))
    found = yield from _found(blocks, {to_db(w.user_id) for w in ws})
    surveys = []
    for w in ws:
        user = to_db(w.user_id)
        below = min(w.before_seq, through)
        seqs = sorted(seq for seq in found.get(user, ()) if seq < below)
        rows = yield from _rows_of(d, user, seqs)
        seqs, taken = past.withdrawn(rows, w.rule, w.erase)
        surveys.append(past.Survey.of(through, watermark, seqs, taken, decay, now_ns))
    return surveys


def withdraw(d: Dialect, batch: Batch, watermark: int) -> Plan[None]:
    """The batch's purges and erasures take effect. The blocks past their surveys (few:
    the last one or two) are read once for all of them: a commit carries up to a survey's
    100, and a read each was 100 round trips on PostgreSQL, one commit's whole time."""
    surveys = [w.survey for w in batch.past if w.survey is not None]
    assert len(surveys) == len(batch.past), "a withdrawal takes effect once surveyed"
    if not surveys:
        return
    through = min(survey.through for survey in surveys)
    below = max(w.before_seq for w in batch.past)  # no block above holds a row they reach
    # a block starting below ``through`` may reach past it (merged: at most BLOCK rows)
    blocks = yield Rows(
        _BLOCKS + " WHERE first_seq > ? AND first_seq < ?", (through - userrows.BLOCK, below)
    )
    found = userrows.find_all(blocks, {to_db(w.user_id) for w in batch.past})
    for w, survey in zip(batch.past, surveys, strict=True):
        yield from _withdraw(d, w, survey, found.get(to_db(w.user_id), []), watermark, batch)


def _withdraw(d: Dialect, w: past.Withdrawal, survey: past.Survey, in_blocks: list[int],
              watermark: int, batch: Batch) -> Plan[None]:  # fmt: skip
    """One takes effect: the rows past its survey found (``in_blocks``, the blocks'
    rows of its user, and memory's tail), its sums off the tables (rows up to
    ``watermark``) now and off the board once committed, and its rule recorded, so that
    its rows count as rewritten until they are (``core.rewrites``)."""
    began = time.perf_counter()
    user = to_db(w.user_id)
    found = [seq for seq in in_blocks if survey.through <= seq < w.before_seq]
    found += [seq for seq in w.recent if seq >= survey.through]
    rows = yield from _rows_of(d, user, sorted(set(found)))
    aggregates, bucket_rows = w.add(rows, watermark, batch.decay, batch.now_ns)
    yield from buckets.withdraw(
        survey.table[0] + aggregates, survey.table[1] + bucket_rows, batch.decay
    )
    if w.seqs:
        rule = w.rule.wider(w.erase, w.before_seq)
        yield Exec(_PUT_RULE, (user, rule.purge_before, rule.erase_before))
    w.seconds = time.perf_counter() - began


def rewrite(d: Dialect, r: Rewrite) -> Plan[Rewritten]:
    """One chunk of a withdrawal's rows rewritten: flipped (purge) or deleted, with their
    keys and their entries in the blocks (erase); with the last, the user's rule goes.
    Returns the keys it deleted, and its time."""
    began = time.perf_counter()
    listed, user = d.seqs(r.seqs), to_db(r.user)
    mine = f"{d.in_seqs} AND user_id = ?"
    found: list[tuple[str, int]] = []
    if r.seqs and r.erase:
        keys = f"DELETE FROM signal_keys WHERE {d.in_seqs} RETURNING key, seq"
        found = yield Rows(keys, (listed,))
        deleted = yield Changed(f"DELETE FROM ledger WHERE {mine}", (listed, user))
        # the block each row is in: the last to start at or before it (a cluster's blocks
        # are one per commit, not one per BLOCK seqs)
        containing = (
            f"SELECT first_seq, users FROM ledger_users WHERE first_seq IN"
            f" (SELECT (SELECT MAX(first_seq) FROM ledger_users WHERE first_seq <= s.seq)"
            f" FROM {d.listed('seq')} s)"
        )
        for first, block in (yield Rows(containing, (listed,))):
            inside = [seq for seq in r.seqs if first <= seq < first + len(block) // 8]
            if inside:  # a row past the last block (in memory) is in none
                yield Exec(PUT_BLOCK, (first, userrows.blank(block, first, inside)))
        if deleted:  # retention may have taken some first
            yield Exec(ADD_META, ("ledger_deleted", deleted))
    elif r.seqs:
        yield Exec(
            f"UPDATE ledger SET forwarded = 0 WHERE {mine} AND forwarded = 1", (listed, user)
        )
    if r.last:
        yield Exec("DELETE FROM rewrites WHERE user_id = ?", (user,))
    return Rewritten(found, time.perf_counter() - began)


def rules() -> Plan[dict[int, Rule]]:
    """The rules of withdrawals whose rows are not all rewritten yet, by user_id."""
    rows = yield Rows("SELECT user_id, purge_before, erase_before FROM rewrites")
    return {from_db(user): Rule(purge, erase) for user, purge, erase in rows}


def unwritten(
    d: Dialect, rules: dict[int, Rule], tails: dict[int, list[int]]
) -> Plan[dict[int, tuple[list[int], list[int]]]]:
    """At boot, on the reader: the rows each rule (by user_id) still covers, as the
    erase's and the purge's to rewrite, the blocks read once for all of them (a clean-up
    killed midway leaves thousands). ``tails``: each user's rows past the last block
    (from memory)."""
    blocks = yield Rows(_BLOCKS)
    found = yield from _found(blocks, {to_db(user) for user in rules})
    query = f"SELECT seq, forwarded FROM ledger WHERE {d.in_seqs} AND user_id = ? ORDER BY seq"
    out = {}
    for user_id, rule in rules.items():
        user = to_db(user_id)
        below = max(rule.purge_before, rule.erase_before)
        listed = {seq for seq in found.get(user, ()) if seq < below}
        seqs = sorted(listed.union(seq for seq in tails.get(user_id, ()) if seq < below))
        rows: list[tuple[int, int]] = []
        if seqs:
            rows = yield Rows(query, (d.seqs(seqs), user))
        erase = [seq for seq, _ in rows if seq < rule.erase_before]
        purge = [seq for seq, fwd in rows if seq >= rule.erase_before and fwd]
        out[user_id] = (erase, purge)
    return out


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

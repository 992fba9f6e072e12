"""The SQL of ledger retention: the oldest rows deleted, a chunk a commit, and the blocks of
``ledger_users`` (``userrows``) no row is left in. One tidal's rows follow time in seq
order; a cluster's follow it within each node's range of seqs only."""

from __future__ import annotations

from typing import Final

from tidal.server.core import userrows

from .sqlbulk import HEAD_LOCK, Changed, Exec, Plan, Rows

_RETIRE_BLOCKS: Final = """
    DELETE FROM ledger_users WHERE first_seq IN (
        SELECT first_seq FROM ledger_users WHERE first_seq <= ? ORDER BY first_seq LIMIT ?)"""
# the oldest rows, in seq order, that are old enough: a pass reads at most a chunk of rows,
# and none past the first row still young (times follow seqs, but for a clock stepped back)
_OLDEST: Final = "SELECT ts_ns FROM ledger ORDER BY seq LIMIT 1"
_RETIRE: Final = """
    DELETE FROM ledger WHERE seq IN (
        SELECT seq FROM ledger WHERE seq <= ? ORDER BY seq LIMIT ?) AND ts_ns < ?"""


def retire(retire: tuple[int, int], watermark: int) -> Plan[int]:
    """A chunk of ledger retention, ``retire``: (rows before ts_ns, at most); then the
    blocks of ``ledger_users`` no row is left in. How many rows it deleted."""
    before_ns, most = retire
    oldest = yield Rows(_OLDEST)
    if not oldest or oldest[0][0] >= before_ns:  # nothing is old enough: one row read
        return 0
    gone: int = yield Changed(_RETIRE, (watermark, most, before_ns))
    ((first,),) = yield Rows("SELECT MIN(seq) FROM ledger")
    first = first if first is not None else watermark + 1
    yield Changed(_RETIRE_BLOCKS, (first - userrows.BLOCK, most))
    return gone


#: cluster mode: each node gives seqs from blocks of 2**40 of its own (``postgres.cluster``),
#: so seqs follow time within a range, not across ranges
_RANGE: Final = 1 << 40
#: the ranges whose oldest row is old enough: an index probe each
_OLD_RANGES: Final = """
    SELECT r.n FROM generate_series(0, (SELECT next_block FROM tidal_cluster) - 1) AS r(n),
    LATERAL (SELECT ts_ns FROM ledger WHERE seq >= r.n * ? AND seq < (r.n + 1) * ?
             ORDER BY seq LIMIT 1) AS oldest
    WHERE oldest.ts_ns < ?"""
_RETIRE_RANGE: Final = """
    DELETE FROM ledger WHERE seq IN (
        SELECT seq FROM ledger WHERE seq >= ? AND seq < ? ORDER BY seq LIMIT ?) AND ts_ns < ?"""
#: the blocks no row of the range is left in (merged blocks hold 4,096 rows at most)
_RETIRE_RANGE_BLOCKS: Final = """
    DELETE FROM ledger_users WHERE first_seq >= ? AND first_seq < ?
        AND first_seq + octet_length(users) / 8 <= COALESCE(
            (SELECT MIN(seq) FROM ledger WHERE seq >= ? AND seq < ?), ?)"""


def retire_ranges(retire: tuple[int, int]) -> Plan[int]:
    """Cluster mode (PostgreSQL): a chunk of ledger retention, the oldest rows of each
    node's range of seqs, and the blocks of ``ledger_users`` left empty; how many rows.
    Under the log head's lock, which every transaction writing blocks holds (a merge of
    them too). The board keeps counting the rows, as one tidal's does: windows end by time
    anyway."""
    before_ns, most = retire
    yield Rows(HEAD_LOCK)
    old = [n for (n,) in (yield Rows(_OLD_RANGES, (_RANGE, _RANGE, before_ns)))]
    gone = 0
    share = max(1, most // len(old)) if old else 0
    for n in old:
        low, high = n * _RANGE, (n + 1) * _RANGE
        gone += yield Changed(_RETIRE_RANGE, (low, high, share, before_ns))
        yield Exec(_RETIRE_RANGE_BLOCKS, (low, high, low, high, high))
    return gone

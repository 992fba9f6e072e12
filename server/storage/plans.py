"""What each storage call does, statement by statement, for both backends (see ``sqlbulk``).

The boot's load, and a batch's reads and writes in one transaction: written once,
as plans, and run by ``storage_sqlite`` or ``storage_pg``.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Final

import msgpack

from tidal.server.core import past, windows
from tidal.server.core.batch import Batch
from tidal.server.core.restore import BoardRows, from_row
from tidal.server.core.rewrites import GONE, Rule, reach
from tidal.server.core.sums import aggregate_rows, bucket_rows

from . import buckets, events
from . import past as storage_past
from .interface import Snapshot
from .sqlbulk import (
    ADD_META,
    SET_META,
    Begin,
    Bulk,
    Commit,
    Dialect,
    Exec,
    Fill,
    Many,
    Plan,
    Put,
    Rows,
    from_db,
    put_aggregates,
    table_watermark,
    to_db,
)

log = logging.getLogger("tidal.storage")

LEDGER: Final = Bulk(
    "INSERT INTO ledger (seq, user_id, entity, kind, weight, ts_ns, forwarded, context, at_ns)",
    ("bigint", "bigint", "text", "text", "float8", "bigint", "smallint", "bytea", "bigint"),
)
_MEMBERSHIPS: Final = Bulk(
    'INSERT INTO memberships (user_id, "left", left_at_ns)',
    ("bigint", "smallint", "bigint"),
    ' ON CONFLICT (user_id) DO UPDATE SET "left" = excluded."left",'
    " left_at_ns = excluded.left_at_ns",
)
_KEYS: Final = Bulk(
    "INSERT INTO signal_keys (key, seq, forwarded, ts_ns)",
    ("text", "bigint", "smallint", "bigint"),
    " ON CONFLICT (key) DO UPDATE SET seq = excluded.seq, forwarded = excluded.forwarded,"
    " ts_ns = excluded.ts_ns",
)
# ids below 2**63 (stored as they are), then those above (stored negative)
_MEMBERS: Final = 'SELECT user_id, left_at_ns FROM memberships WHERE "left" = ?'
_SELECT_MEMBERS: Final = _MEMBERS + " AND user_id >= 0"
_SELECT_HIGH_MEMBERS: Final = _MEMBERS + " AND user_id < 0"
_UPSERT_COHORT: Final = (
    "INSERT INTO cohorts (id, name, predicate) VALUES (?, ?, ?)"
    " ON CONFLICT (name) DO UPDATE SET id = excluded.id, predicate = excluded.predicate"
)


def load(
    d: Dialect, keys_since_ns: int, max_keys: int, half_lives: Sequence[int], now_ns: int
) -> Plan[Snapshot]:
    left: dict[int, int] = {}
    rejoined: dict[int, int] = {}
    for is_left, members in ((1, left), (0, rejoined)):
        yield Fill(_SELECT_MEMBERS, (is_left,), members)
        for uid, at in (yield Rows(_SELECT_HIGH_MEMBERS, (is_left,))):
            members[from_db(uid)] = at
    cohorts = [
        (cid, name, msgpack.unpackb(blob, raw=False))
        for cid, name, blob in (yield Rows("SELECT id, name, predicate FROM cohorts ORDER BY id"))
    ]
    rules = yield from storage_past.rules()
    ((max_seq,),) = yield Rows("SELECT COALESCE(MAX(seq), 0) FROM ledger")
    meta = dict((yield Rows("SELECT key, value FROM meta")))
    watermark = int(meta.get("aggregates_seq", 0))
    legacy = bool(
        (yield Rows("SELECT 1 FROM aggregates LIMIT 1"))
        or (yield Rows("SELECT 1 FROM buckets LIMIT 1"))
    )
    decay, board_seq = yield from _board(meta, half_lives, now_ns, watermark, legacy)
    if watermark > board_seq:
        if legacy:
            yield from _align(board_seq, watermark)
        watermark = board_seq
    board = BoardRows(decay=decay, next_tally_id=int(meta.get("next_tally_id", 1)))
    if legacy:
        board.aggregates = yield Rows(buckets.SELECT_AGGREGATES)
        board.buckets = yield Rows(buckets.SELECT)
    else:
        board.missing = buckets.missing_half_lives((yield Rows(buckets.SELECT_DECAYS)), half_lives)
        if board.missing and watermark:
            rows = yield from _read_rows(" WHERE seq <= ?", (watermark,), rules)
            contributions = [from_row(row) for row in rows]
            board.trends = bucket_rows(contributions, decay, now_ns, board.missing)
            log.info(
                "filled the %s trend from %d ledger rows (rows that retention deleted are in"
                " all-time counts only)",
                ", ".join(map(windows.show_half_life, board.missing)),
                len(rows),
            )
        board.chunks = yield Rows(buckets.SELECT_CHUNKS)
        board.parts = yield Rows(buckets.SELECT_PARTS)
    board.withdrawn = buckets.withdrawn(
        (yield Rows("SELECT data FROM withdrawals ORDER BY id")), decay
    )
    tail = yield from _read_rows(" WHERE seq > ? ORDER BY seq", (watermark,), rules)
    newest_keys = yield Rows(
        "SELECT key, seq, forwarded, ts_ns FROM signal_keys WHERE ts_ns >= ?"
        " ORDER BY ts_ns DESC LIMIT ?",
        (keys_since_ns, max_keys),
    )
    keys = OrderedDict((key, (seq, bool(fwd), ts)) for key, seq, fwd, ts in reversed(newest_keys))
    ((last_event,),) = yield Rows("SELECT MAX(at_ns) FROM history")  # at_ns only grows
    last_event_id, last_feed_ns = yield from events.last(int(meta.get("last_event_id", 0)))
    next_seq = max(int(max_seq) + 1, int(meta.get("next_seq", 1)), watermark + 1)
    kept = next_seq - 1 - int(meta.get("ledger_deleted", 0))  # every seq was a row once
    if any(rule.erase_before for rule in rules.values()):  # rows that count as gone already
        ((erased,),) = yield Rows(_ERASED_UNDELETED)
        kept -= erased
    next_block, users_tail = yield from storage_past.catch_up_blocks(next_seq)
    return Snapshot(
        left,
        rejoined,
        cohorts,
        next_seq,
        int(meta.get("next_cohort_id", 1)),
        watermark,
        tail,
        keys,
        kept,
        max(last_event or 0, last_feed_ns),
        next_block,
        users_tail,
        board,
        last_event_id,
        rules,
    )


_ROWS: Final = "SELECT seq, entity, kind, weight, forwarded, context, COALESCE(at_ns, ts_ns)"


_ERASED_UNDELETED: Final = (
    "SELECT COUNT(*) FROM ledger l JOIN rewrites r ON r.user_id = l.user_id"
    " WHERE l.seq < r.erase_before"
)


def _read_rows(where: str, args: tuple[Any, ...], rules: dict[int, Rule]) -> Plan[list[Any]]:
    """Ledger rows as they count: through the rules of withdrawals whose rows are not all
    rewritten yet (``core.rewrites``)."""
    if not rules:
        rows: list[Any] = yield Rows(_ROWS + " FROM ledger" + where, args)
        return rows
    counted = []
    for *row, user in (yield Rows(_ROWS + ", user_id FROM ledger" + where, args)):
        rule = rules.get(user)
        if rule is not None:
            row[4] = reach(rule, row[0], row[4])
            if row[4] == GONE:
                continue
        counted.append(tuple(row))
    return counted


def _align(board_seq: int, watermark: int) -> Plan[None]:
    """A database written before the two tables shared a watermark: the aggregates table
    ran to the end of each checkpoint's batch, the buckets to its start. The rows
    between come off the aggregates table, so that both run to the lower."""
    rows = yield Rows(_ROWS + " FROM ledger WHERE seq > ? AND seq <= ?", (board_seq, watermark))
    taken = [
        (entity, kind, -1, -weight, at, cohorts, communities, True)
        for entity, kind, _, weight, at, cohorts, communities, _ in map(from_row, rows)
    ]
    deltas = aggregate_rows(taken)
    yield Begin()
    yield from put_aggregates(deltas)
    yield Many("DELETE FROM aggregates WHERE entity = ? AND count = 0", [(e[0],) for e in deltas])
    yield Exec(SET_META, ("aggregates_seq", board_seq))
    yield Commit()


def _board(
    meta: dict[str, Any], half_lives: Sequence[int], now_ns: int, watermark: int, legacy: bool
) -> Plan[tuple[list[tuple[int, int]], int]]:
    """Each half-life's base, and the board's watermark. In the row tables of before
    (``legacy``), the buckets are filled from the ledger where they are missing (a
    database from before them, or a half-life not seen before) and a base moved is moved
    in them; chunks say their bases, and ``load`` fills what they lack."""
    decay = []
    missing = []
    moved = []
    for hl in half_lives:
        base = meta.get(f"trend_base_{hl}")
        if base is None:
            base = windows.first_base(now_ns, hl)
            missing.append(hl)
        elif windows.stale(int(base), now_ns, hl):
            new = windows.first_base(now_ns, hl)
            moved.append((hl, windows.rebase_factor(int(base), new, hl)))
            base = new
        decay.append((hl, int(base)))
    behind = "board_seq" not in meta
    board_seq = watermark if behind else int(meta["board_seq"])
    if not (missing or behind or moved):
        return decay, board_seq
    yield Begin()
    for hl, factor in moved:  # by a power of two: exact, and the order is unchanged
        if legacy:
            yield Exec("UPDATE buckets SET weight = weight * ? WHERE tier = 2 AND bucket = ?",
                       (factor, hl))  # fmt: skip
        log.info("moved the base of the %s trend to %d half-lives ahead", hl, windows.BASE_AHEAD)
    if board_seq and legacy:
        rows = yield Rows(_ROWS + " FROM ledger WHERE seq <= ?", (board_seq,))
        contributions = [from_row(row) for row in rows]
        if behind:
            yield Exec("DELETE FROM buckets")
        only = None if behind else missing
        yield from buckets.put(buckets.BUCKETS, bucket_rows(contributions, decay, now_ns, only))
        log.info(
            "filled the board's buckets from %d ledger rows (rows that retention deleted are"
            " in all-time counts only)",
            len(rows),
        )
    for hl, base in decay:
        yield Exec(SET_META, (f"trend_base_{hl}", base))
    yield Exec(SET_META, ("board_seq", board_seq))
    yield Commit()
    return decay, board_seq


def apply(d: Dialect, batch: Batch, batch_id: int | None = None) -> Plan[bool]:
    """The batch's reads, then its writes in one transaction. True if one was committed.

    Reads come first: ``history`` and ``left_users`` lay over what they read the writes
    their batch carries (see ``past``), and a replay reads what committed before them. A
    batch that changes nothing costs no transaction.
    """
    for page in batch.feed_reads:
        yield from events.read(page)
    for read in batch.reads:
        if isinstance(read, past.HistoryRead):
            args = (to_db(read.user_id), read.after_ns, read.limit)
            read.rows = yield Rows(storage_past.SELECT_HISTORY, args)
        else:
            read.rows = yield from storage_past.left_users(read.after, read.wanted())
    if (
        not batch.writes
        and batch.board_changed is None
        and batch.retire is None
        and batch.retire_events is None
        and batch.rewrite is None
    ):
        if batch.reach:  # a health check: proof the database answers
            yield Rows("SELECT 1")
        return False
    yield Begin()
    yield Put(LEDGER, batch.ledger)
    memberships = batch.memberships.items()
    yield Put(_MEMBERSHIPS, [(to_db(u), int(left), at) for u, (left, at) in memberships])
    if batch.cohorts:
        yield from _write_cohorts(batch)
    yield Put(_KEYS, [(key, *ack) for key, ack in batch.keys.items()])
    if batch.probe:
        yield Exec(SET_META, ("health_probe_ns", time.time_ns()))
    if batch.forget_keys_before is not None:
        yield Exec("DELETE FROM signal_keys WHERE ts_ns < ?", (batch.forget_keys_before,))
    board, shelf, changed = batch.board_state, batch.shelf, batch.board_changed
    if board is not None and shelf is not None and changed is not None:
        batch.board_written = yield from buckets.checkpoint(board, shelf, changed, batch.now_ns)
        yield Exec(SET_META, ("aggregates_seq", batch.first_seq - 1))
        yield Exec(SET_META, ("board_seq", batch.first_seq - 1))
    if batch.users_blocks:
        yield Many(storage_past.PUT_BLOCK, batch.users_blocks)
    if batch.past or batch.retire is not None or batch.rewrite is not None:
        # after the checkpoint: what it wrote is the table these rows are withdrawn from
        watermark = yield from table_watermark()
        # rows are about to go, maybe the newest: a seq once acknowledged is never
        # given again, so the next boot must not take its next seq from what is left
        yield Exec(SET_META, ("next_seq", batch.first_seq + len(batch.ledger)))
        if batch.rewrite is not None:  # before the withdrawals: one may write its rule anew
            yield from storage_past.rewrite(d, batch.rewrite)
        for withdrawal in batch.past:
            yield from storage_past.withdraw(d, withdrawal, watermark, batch)
        if batch.retire is not None:  # only rows the tables hold
            yield from storage_past.retire(batch, watermark)
            if batch.retired:  # so that boot knows how many rows there are without counting
                yield Exec(ADD_META, ("ledger_deleted", batch.retired))
    if batch.history:
        lines = [(to_db(e.user_id), e.at_ns, e.event, e.signals()) for e in batch.history]
        yield Put(storage_past.HISTORY, lines)
    yield from events.write(batch)
    yield Commit(batch_id)
    return True


def _write_cohorts(batch: Batch) -> Plan[None]:
    dropped = [(name,) for name, c in batch.cohorts.items() if c is None]
    defined = [
        (c.id, c.name, msgpack.packb(c.predicate, use_bin_type=True))
        for c in batch.cohorts.values()
        if c is not None
    ]
    if dropped:
        yield Many("DELETE FROM cohorts WHERE name = ?", dropped)
    if defined:
        yield Many(_UPSERT_COHORT, defined)
    if batch.next_cohort_id is not None:
        yield Exec(SET_META, ("next_cohort_id", batch.next_cohort_id))

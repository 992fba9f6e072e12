"""Boot's read of the database: everything the engine keeps in memory, as one plan for both
backends (see ``sqlbulk``), and the fills a database from before needs once."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Final

import msgpack

from tidal.server.core import windows
from tidal.server.core.restore import BoardRows, from_row
from tidal.server.core.rewrites import GONE, Rule, reach
from tidal.server.core.sums import aggregate_rows, bucket_rows

from . import buckets, events, groups_sql
from . import past_sql as storage_past
from .interface import Snapshot
from .sqlbulk import (
    SET_META,
    Begin,
    Commit,
    Dialect,
    Exec,
    Fill,
    Many,
    Plan,
    Rows,
    from_db,
    put_aggregates,
)

log = logging.getLogger("tidal.storage")

# ids below 2**63 (stored as they are), then those above (stored negative)
_MEMBERS: Final = 'SELECT user_id, left_at_ns FROM memberships WHERE "left" = ?'
_SELECT_MEMBERS: Final = _MEMBERS + " AND user_id >= 0"
_SELECT_HIGH_MEMBERS: Final = _MEMBERS + " AND user_id < 0"


def load(
    d: Dialect, keys_since_ns: int, max_keys: int, half_lives: Sequence[int], now_ns: int
) -> Plan[Snapshot]:
    left, rejoined = yield from _members()
    cohorts = [
        (cid, name, msgpack.unpackb(blob, raw=False))
        for cid, name, blob in (yield Rows("SELECT id, name, predicate FROM cohorts ORDER BY id"))
    ]
    rules = yield from storage_past.rules()
    ((max_seq,),) = yield Rows("SELECT COALESCE(MAX(seq), 0) FROM ledger")
    meta = dict((yield Rows("SELECT key, value FROM meta")))
    watermark = int(meta.get("aggregates_seq", 0))
    board, watermark = yield from _read_board(meta, half_lives, now_ns, watermark, rules)
    tail = yield from _read_rows(" WHERE seq > ? ORDER BY seq", (watermark,), rules)
    keys = yield from _keys(keys_since_ns, max_keys)
    ((last_event,),) = yield Rows("SELECT MAX(at_ns) FROM history")  # at_ns only grows
    last_event_id, last_feed_ns = yield from events.last(int(meta.get("last_event_id", 0)))
    next_seq = max(int(max_seq) + 1, int(meta.get("next_seq", 1)), watermark + 1)
    kept = next_seq - 1 - int(meta.get("ledger_deleted", 0))  # every seq was a row once
    if any(rule.erase_before for rule in rules.values()):  # rows that count as gone already
        ((erased,),) = yield Rows(_ERASED_UNDELETED)
        kept -= erased
    next_block, users_tail = yield from storage_past.catch_up_blocks(next_seq)
    groups = yield from groups_sql.load()
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
        groups,
    )


def _members() -> Plan[tuple[dict[int, int], dict[int, int]]]:
    """Users who left, and users who rejoined, with when."""
    left: dict[int, int] = {}
    rejoined: dict[int, int] = {}
    for is_left, members in ((1, left), (0, rejoined)):
        yield Fill(_SELECT_MEMBERS, (is_left,), members)
        for uid, at in (yield Rows(_SELECT_HIGH_MEMBERS, (is_left,))):
            members[from_db(uid)] = at
    return left, rejoined


def _read_board(
    meta: dict[str, Any],
    half_lives: Sequence[int],
    now_ns: int,
    watermark: int,
    rules: dict[int, Rule],
) -> Plan[tuple[BoardRows, int]]:
    """The board as its checkpoint holds it (or a database from before, as its tables
    did), and the watermark it stands at."""
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
    return board, watermark


def _keys(since_ns: int, most: int) -> Plan[OrderedDict[str, tuple[int, bool, int, int | None]]]:
    """The idempotency keys still in the window, the newest ``most``, oldest first."""
    newest = yield Rows(
        "SELECT key, seq, forwarded, ts_ns FROM signal_keys WHERE ts_ns >= ?"
        " ORDER BY ts_ns DESC LIMIT ?",
        (since_ns, most),
    )
    return OrderedDict((key, (seq, bool(fwd), ts, None)) for key, seq, fwd, ts in reversed(newest))


def load_node(half_lives: Sequence[int], now_ns: int, first_seq: int) -> Plan[Snapshot]:
    """Cluster mode: what a node needs before it serves any partition. Leave state and keys
    come per partition, as it takes them (``cluster``); it keeps no board on disk yet."""
    cohorts = [
        (cid, name, msgpack.unpackb(blob, raw=False))
        for cid, name, blob in (yield Rows("SELECT id, name, predicate FROM cohorts ORDER BY id"))
    ]
    meta = dict((yield Rows("SELECT key, value FROM meta")))
    decay = [(hl, windows.first_base(now_ns, hl)) for hl in half_lives]
    board = BoardRows(decay=decay, next_tally_id=1)
    return Snapshot(
        {}, {}, cohorts, first_seq, int(meta.get("next_cohort_id", 1)), first_seq - 1, [],
        OrderedDict(), 0, 0, first_seq, [], board, 0, {},
    )  # fmt: skip


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
        rule = rules.get(from_db(user))
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

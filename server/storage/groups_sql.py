"""The SQL of the consumer groups: each group's row (its settings, cursor and the range it
lost), a row per event it has sent, acknowledged out of order, or dead-lettered, and
each user's latest opt-outs, the receipts' subjects. One plan for both backends.

An event's row is written as it is sent (its count), acknowledged or killed; the rows of
events acknowledged leave once the cursor passes them, but an opt-out's stays: it is
the receipt's proof (when it was acknowledged, and by which group).
"""

from __future__ import annotations

from typing import Any, Final, TypeAlias

import msgpack

from tidal.server.core import feed
from tidal.server.core.batch import Batch
from tidal.server.core.group_batch import GroupWrites
from tidal.server.core.group_parts import ACKED, DEAD, OPTOUTS, PENDING, Entry, Recorded, Spec
from tidal.server.core.ledger import from_db, to_db

from .sqlbulk import Bulk, Dialect, Exec, Many, Plan, Put, Rows

GROUP_EVENTS: Final = Bulk(
    "INSERT INTO group_events (grp, event_id, user_id, kind, at_ns, deliveries, first_ns,"
    " state, done_ns, reason, data)",
    (
        "text",
        "bigint",
        "bigint",
        "smallint",
        "bigint",
        "integer",
        "bigint",
        "smallint",
        "bigint",
        "text",
        "bytea",
    ),
    " ON CONFLICT (grp, event_id) DO UPDATE SET deliveries = excluded.deliveries,"
    " first_ns = excluded.first_ns, state = excluded.state, done_ns = excluded.done_ns,"
    " reason = excluded.reason, data = excluded.data",
)
OPTOUT_ROWS: Final = Bulk(
    "INSERT INTO optouts (user_id, kind, event_id, at_ns)",
    ("bigint", "smallint", "bigint", "bigint"),
    " ON CONFLICT (user_id, kind) DO UPDATE SET event_id = excluded.event_id,"
    " at_ns = excluded.at_ns",
)
_CREATE: Final = (
    "INSERT INTO groups (name, start, cursor, ack_wait_ns, max_deliveries, wait, kinds,"
    " created_ns, lost_first, lost_last) VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL)"
)
_NOT_OPTOUT: Final = f"kind NOT IN ({', '.join(str(k) for k in sorted(OPTOUTS))})"
#: the rows of events acknowledged that the cursor passed (between the one recorded before
#: and the new), but an opt-out's (the receipt's): a range, never the group's every row
_PASSED: Final = (
    f"DELETE FROM group_events WHERE grp = ? AND event_id > ? AND event_id <= ?"
    f" AND state = {ACKED} AND {_NOT_OPTOUT}"
)


def optouts(batch: Batch) -> Plan[None]:
    """With the events: each user's latest leave, purge and erase, for receipts."""
    rows = {
        (change.user_id, change.kind): (to_db(change.user_id), change.kind, change.id, change.at_ns)
        for change in batch.changes
        if change.kind in OPTOUTS and change.user_id is not None
    }
    if rows:
        yield Put(OPTOUT_ROWS, list(rows.values()))


def write(w: GroupWrites) -> Plan[None]:
    for name in w.dropped:
        yield Exec("DELETE FROM group_events WHERE grp = ?", (name,))
        yield Exec("DELETE FROM groups WHERE name = ?", (name,))
    for row in w.created.values():
        yield Exec(_CREATE, row)
    for name, cursor in w.reset.items():
        # what it sent goes, and what it acknowledged past its new cursor (to be sent
        # again); its dead letters stay, and its receipts up to the cursor
        yield Exec(
            f"DELETE FROM group_events WHERE grp = ? AND state <> {DEAD}"
            f" AND (state = {PENDING} OR event_id > ?)",
            (name, cursor),
        )
    if w.rows:
        rows = [(*r[:2], None if r[2] is None else to_db(r[2]), *r[3:]) for r in w.rows]
        yield Put(GROUP_EVENTS, rows)
    if w.cursors:
        moved = [(name, *span) for name, span in w.cursors.items()]
        yield Many("UPDATE groups SET cursor = ? WHERE name = ?", [(c, n) for n, _, c in moved])
        if passed := [m for m in moved if m[1] < m[2]]:
            yield Many(_PASSED, passed)
    for name, lost in w.lost.items():
        first, last = lost if lost is not None else (None, None)
        yield Exec(
            "UPDATE groups SET lost_first = ?, lost_last = ? WHERE name = ?", (first, last, name)
        )


#: a group as boot reads it: settings, cursor, lost range, dead letters (and those sent
#: back), what its rows say of the events past its cursor
Loaded: TypeAlias = tuple[Spec, int, tuple[int, int] | None, list[Entry], dict[int, Recorded]]


def load() -> Plan[list[Loaded]]:
    """At boot: each group, its cursor and lost range, its dead letters and those sent
    back (with their data), and what its rows say of the events past its cursor."""
    groups = []
    for row in (
        yield Rows(
            "SELECT name, start, cursor, ack_wait_ns, max_deliveries, wait, kinds, created_ns,"
            " lost_first, lost_last FROM groups ORDER BY name"
        )
    ):
        name, start, cursor, ack_wait, most, wait, kinds, created, first, last = row
        spec = Spec(
            name,
            int(start),
            int(ack_wait),
            int(most),
            bool(wait),
            None if kinds is None else frozenset(msgpack.unpackb(bytes(kinds))),
            int(created),
        )
        kept: list[Entry] = []
        recorded: dict[int, Recorded] = {}
        for r in (
            yield Rows(
                "SELECT event_id, user_id, kind, at_ns, deliveries, first_ns, state, done_ns,"
                " reason, data FROM group_events WHERE grp = ? AND (state = ? OR event_id > ?"
                " OR data IS NOT NULL) ORDER BY event_id",
                (name, DEAD, cursor),
            )
        ):
            eid, user, kind, at, deliveries, first_ns, state, done, reason, data = r
            if state == DEAD or (data is not None and state == PENDING and eid <= cursor):
                entry = Entry(
                    int(eid),
                    int(kind),
                    None if user is None else from_db(int(user)),
                    int(at),
                    bytes(data),
                    int(deliveries),
                    int(first_ns),
                    state=int(state),
                    done_ns=int(done),
                    reason=str(reason),
                )
                kept.append(entry)
            elif eid > cursor:
                recorded[int(eid)] = Recorded(int(state), int(deliveries), int(first_ns))
        lost = None if first is None else (int(first), int(last))
        groups.append((spec, int(cursor), lost, kept, recorded))
    return groups


def loaded(d: Dialect) -> Plan[list[Loaded]]:
    """``load``, as a read beside the writer takes it: cluster mode's node that takes
    partition 0 reads the groups so."""
    return (yield from load())


def spec_row(spec: Spec, cursor: int) -> tuple[Any, ...]:
    kinds = None if spec.kinds is None else msgpack.packb(sorted(spec.kinds))
    return (
        spec.name,
        spec.start,
        cursor,
        spec.ack_wait_ns,
        spec.max_deliveries,
        int(spec.wait),
        kinds,
        spec.created_ns,
    )


# -- receipts ----------------------------------------------------------------

_RECEIPT_GROUPS: Final = (
    "SELECT name, start, cursor, lost_first, lost_last, created_ns FROM groups ORDER BY name"
)


def receipt(user_id: int) -> Any:
    """``receipt``'s plan: the user's latest opt-outs, and each group's rows of them."""

    def plan(d: Dialect) -> Plan[dict[str, Any]]:
        outs = yield Rows(
            "SELECT kind, event_id, at_ns FROM optouts WHERE user_id = ? ORDER BY kind",
            (to_db(user_id),),
        )
        groups = yield Rows(_RECEIPT_GROUPS)
        ids = [int(eid) for _, eid, _ in outs]
        rows = []
        if ids:
            rows = yield Rows(
                "SELECT grp, event_id, deliveries, first_ns, state, done_ns, reason"
                f" FROM group_events WHERE {d.among('event_id')}",
                (d.seqs(ids),),
            )
        return {"optouts": list(outs), "groups": list(groups), "rows": list(rows)}

    return plan


def unconfirmed(group: str | None, before_ns: int, after: int | None, limit: int) -> Any:
    """``unconfirmed``'s plan: users whose latest opt-out, older than ``before_ns``, a group
    (``group``, or any) that followed it has not acknowledged, in user order."""

    def plan(d: Dialect) -> Plan[list[tuple[Any, ...]]]:
        among = "" if group is None else " AND g.name = ?"
        named = () if group is None else (group,)
        since = "" if after is None else " AND o.user_id > ?"
        start = () if after is None else (to_db(after),)
        unacked = (
            " FROM optouts o JOIN groups g ON o.event_id > g.start"
            f" WHERE o.at_ns < ?{among}"
            " AND NOT EXISTS (SELECT 1 FROM group_events e WHERE e.grp = g.name"
            f" AND e.event_id = o.event_id AND e.state = {ACKED})"
        )
        users = yield Rows(
            f"SELECT DISTINCT o.user_id{unacked}{since} ORDER BY o.user_id LIMIT ?",
            (before_ns, *named, *start, limit),
        )
        if not users:
            return []
        rows = yield Rows(
            f"SELECT o.user_id, o.kind, o.event_id, o.at_ns, g.name{unacked}"
            f" AND {d.among('o.user_id')} ORDER BY o.user_id, o.kind, g.name",
            (before_ns, *named, d.seqs([int(u) for (u,) in users])),
        )
        return [(from_db(int(u)), int(k), int(e), int(a), str(g)) for u, k, e, a, g in rows]

    return plan


KIND_NAMES: Final = {feed.LEAVE: "leave", feed.PURGE: "purge", feed.ERASE: "erase"}

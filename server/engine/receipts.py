"""Receipts: what an operator shows an auditor. For a user's latest leave, purge and
erase, each group's word, read as committed: acknowledged (when: its consumer applied
it), pending (since when, delivered how often), dead_letter (with the reason), lost
(retention deleted it before the group read it) or skipped (a ``group_reset`` moved the
cursor past it). A group made after the opt-out, or that does not take its kind, has
no word on it. ``unconfirmed`` pages through the users whose latest opt-out some group
has not acknowledged."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tidal.server.core.group_parts import ACKED, DEAD
from tidal.server.storage import groups_sql
from tidal.server.storage.sqlbulk import Dialect, Plan

Kinds = dict[str, frozenset[int] | None]


def _word(
    group: tuple[Any, ...], event: tuple[int, int, int], row: tuple[Any, ...] | None
) -> dict[str, Any]:
    _, _, cursor, lost_first, lost_last, _ = group
    _, event_id, at_ns = event
    if row is not None:
        deliveries, first_ns, state, done_ns, reason = row
        if state == ACKED:
            return {"state": "acknowledged", "at_ns": int(done_ns)}
        if state == DEAD:
            return {
                "state": "dead_letter",
                "at_ns": int(done_ns),
                "reason": str(reason),
                "deliveries": int(deliveries),
            }
        return {"state": "pending", "since_ns": int(first_ns), "deliveries": int(deliveries)}
    if lost_first is not None and lost_first <= event_id <= lost_last:
        return {"state": "lost"}
    if event_id <= cursor:
        return {"state": "skipped"}
    return {"state": "pending", "since_ns": int(at_ns), "deliveries": 0}


def receipt_plan(user_id: int, kinds: Kinds) -> Callable[[Dialect], Plan[dict[str, Any]]]:
    read = groups_sql.receipt(user_id)

    def plan(d: Dialect) -> Plan[dict[str, Any]]:
        found = yield from read(d)
        rows = {(str(g), int(e)): tuple(rest) for g, e, *rest in found["rows"]}
        optouts = []
        for kind, event_id, at_ns in found["optouts"]:
            event = (int(kind), int(event_id), int(at_ns))
            words = {}
            for group in found["groups"]:
                name, start = str(group[0]), int(group[1])
                taken = kinds.get(name)
                if event[1] <= start or (taken is not None and event[0] not in taken):
                    continue
                words[name] = _word(group, event, rows.get((name, event[1])))
            optouts.append(
                {
                    "event": groups_sql.KIND_NAMES[event[0]],
                    "id": event[1],
                    "at_ns": event[2],
                    "groups": words,
                }
            )
        return {"user_id": user_id, "optouts": optouts}

    return plan


def unconfirmed_plan(
    group: str | None, before_ns: int, after: int | None, limit: int, kinds: Kinds
) -> Callable[[Dialect], Plan[dict[str, Any]]]:
    read = groups_sql.unconfirmed(group, before_ns, after, limit)

    def plan(d: Dialect) -> Plan[dict[str, Any]]:
        rows = yield from read(d)
        users: dict[tuple[int, int], dict[str, Any]] = {}
        last = None
        for user_id, kind, event_id, at_ns, name in rows:
            last = user_id
            taken = kinds.get(name)
            if taken is not None and kind not in taken:
                continue
            entry = users.setdefault(
                (user_id, kind),
                {
                    "user_id": user_id,
                    "event": groups_sql.KIND_NAMES[kind],
                    "id": event_id,
                    "at_ns": at_ns,
                    "groups": [],
                },
            )
            entry["groups"].append(name)
        distinct = len({u for u, *_ in rows})
        return {"users": list(users.values()), "more": last if distinct >= limit else None}

    return plan

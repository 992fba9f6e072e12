"""What every read must answer, recomputed from the ledger as it counts (``ledger_counted``)
and the cohorts table alone: PROTOCOL.md's rules in plain Python."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import msgpack

from ..conftest import Database

MIN_NS, HOUR_NS = 60 * 10**9, 3600 * 10**9
WINDOWS = {"1h": (MIN_NS, 60), "24h": (MIN_NS, 1440), "7d": (HOUR_NS, 168), "30d": (HOUR_NS, 720)}
HALF_LIFE_NS = 6 * HOUR_NS
ROWS = (
    "SELECT seq, user_id, entity, kind, weight, forwarded, context, COALESCE(at_ns, ts_ns)"
    " FROM ledger_counted"
)


@dataclass(frozen=True)
class Row:
    seq: int
    user: int
    entity: str
    kind: str
    weight: float
    forwarded: bool
    communities: tuple[str, ...]
    cohorts: tuple[int, ...]
    at_ns: int


async def ledger(db: Database) -> dict[int, Row]:
    out = {}
    for seq, user, entity, kind, weight, forwarded, context, at_ns in await db.rows(ROWS):
        communities, cohorts = (), ()
        if context:
            named, _, reached = msgpack.unpackb(context, raw=False)
            communities, cohorts = tuple(named), tuple(reached)
        user = int(user) % 2**64  # PostgreSQL keeps u64 as a signed bigint
        out[seq] = Row(seq, user, entity, kind, float(weight), bool(forwarded), communities,
                       cohorts, at_ns)  # fmt: skip
    return out


def in_window(at_ns: int, window: str, now_ns: int) -> bool:
    """PROTOCOL.md: the window's last n buckets of g, the current one included."""
    if window == "all":
        return True
    g, n = WINDOWS[window]
    return at_ns // g > now_ns // g - n


def places(row: Row, names: dict[int, str]) -> list[tuple[str, str | None]]:
    """The aggregates a row counts in: the ledger layer, and if forwarded its cohorts
    still defined under that id and its communities."""
    out: list[tuple[str, str | None]] = [("ledger", None)]
    if row.forwarded:
        out += [("cohort", names[c]) for c in row.cohorts if c in names]
        out += [("community", name) for name in dict.fromkeys(row.communities)]
    return out


def counts(rows: list[Row], names: dict[int, str], window: str, now_ns: int) -> dict[str, Any]:
    """Each entity's ``counts`` reply, as the wire has it."""
    out: dict[str, Any] = defaultdict(lambda: {"ledger": {}, "cohorts": {}, "communities": {}})
    for row in rows:
        if not in_window(row.at_ns, window, now_ns):
            continue
        for layer, name in places(row, names):
            reply = out[row.entity]
            where = (
                reply["ledger"]
                if name is None
                else reply[{"cohort": "cohorts", "community": "communities"}[layer]].setdefault(
                    name, {}
                )
            )
            tally = where.setdefault(row.kind, {"count": 0, "weight": 0.0})
            tally["count"] += 1
            tally["weight"] += row.weight
    return out


def ranking(rows: list[Row], names: dict[int, str], layer: str, name: str | None, kind: str,
            by: str, window: str, now_ns: int) -> dict[str, tuple[int, float, float]]:  # fmt: skip
    """entity -> (count, weight, score) of one ranking, every entity with a signal in it."""
    out: dict[str, list[float]] = {}
    for row in rows:
        if row.kind != kind or not in_window(row.at_ns, window, now_ns):
            continue
        if (layer, name) not in places(row, names):
            continue
        e = out.setdefault(row.entity, [0, 0.0, 0.0])
        e[0] += 1
        e[1] += row.weight
        e[2] += row.weight * 2.0 ** (-(now_ns - row.at_ns) / HALF_LIFE_NS)
    return {
        entity: (int(c), w, {"count": c, "weight": w, "trend": t}[by])
        for entity, (c, w, t) in out.items()
    }

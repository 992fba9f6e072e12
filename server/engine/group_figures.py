"""What the groups' figures are: each group as ``groups`` describes it, and the figures
the metrics export (read from the metrics' own thread: each read is of a copy)."""

from __future__ import annotations

from typing import Any, Final

from tidal.server.core import feed
from tidal.server.core.group_parts import OPTOUTS
from tidal.server.core.groups import Group
from tidal.server.group_metrics import Figures

#: an opt-out not acknowledged this long is counted as unconfirmed (ns)
UNCONFIRMED_AFTER: Final = 3600 * 10**9


def describe(group: Group, last: int, now: int) -> dict[str, Any]:
    """``groups``' entry for ``group`` (``last``: the feed's last event id)."""
    spec, cursor = group.spec, group.cursor()
    first = next(iter(group.window.values()), None)
    out = [e.first_ns for c in group.consumers.values() for e in c.out.values()]
    names = None if spec.kinds is None else [feed.NAMES[k] for k in sorted(spec.kinds)]
    return {
        "name": spec.name,
        "cursor": cursor,
        "last_id": last,
        "lag_events": max(0, last - cursor),
        "lag_seconds": max(0.0, (now - first.at_ns) / 1e9) if first is not None else 0.0,
        "pending": len(out),
        "oldest_unacked_seconds": max(0.0, (now - min(out)) / 1e9) if out else None,
        "dead_letters": len(group.dead),
        "redelivered": group.redelivered,
        "acknowledged": group.acked,
        "lost": None if group.lost is None else list(group.lost),
        "consumers": [
            {"address": c.peer, "in_flight": len(c.out)} for c in group.consumers.values()
        ],
        "settings": {
            "from": spec.start,
            "ack_wait_s": spec.ack_wait_ns / 1e9,
            "max_deliveries": spec.max_deliveries,
            "order": "wait" if spec.wait else "skip",
            "events": names,
        },
    }


def figures(groups: list[Group], last: int, now: int) -> list[Figures]:
    """Each group's figures for the metrics. The metrics' thread reads while the event
    loop changes the groups: each collection is copied first (a copy that a change cut
    short is made again)."""
    out = []
    for group in groups:
        for _ in range(5):
            try:
                out.append(_figures(group, last, now))
                break
            except RuntimeError:  # changed size during the copy
                continue
    return out


def _figures(group: Group, last: int, now: int) -> Figures:
    consumers = list(group.consumers.values())
    sent = [e.first_ns for c in consumers for e in list(c.out.values())]
    held = [*group.window.values(), *group.revived.values(), *group.dead.values()]
    old = now - UNCONFIRMED_AFTER
    unconfirmed = sum(1 for e in held if e.kind in OPTOUTS and e.at_ns < old)
    lost = 0 if group.lost is None else group.lost[1] - group.lost[0] + 1
    first = next(iter(list(group.window.values())), None)
    return Figures(
        group.name, max(0, last - group.cursor()),
        max(0.0, (now - first.at_ns) / 1e9) if first is not None else 0.0, len(sent),
        max(0.0, (now - min(sent)) / 1e9) if sent else 0.0,
        group.redelivered, len(group.dead), unconfirmed, lost,
    )  # fmt: skip

"""Which function serves each method, named one by one: go-to-definition and grep find a
method's handler from here, and a handler's name is its own (none is reserved for a
method). ``dispatch`` checks this table against the method table at start: a method
declared and not served, or served and not declared, stops the server."""

from __future__ import annotations

from .changes import Changes
from .dispatch import Handler, discover
from .group_calls import GroupCalls
from .publisher import Feed
from .ranked import Ranked
from .reads import Reads


def served(
    signal: Handler, signal_batch: Handler, changes: Changes, feed: Feed, reads: Reads,
    ranked: Ranked, groups: GroupCalls,
) -> dict[str, Handler]:  # fmt: skip
    return {
        "signal": signal,
        "signal_batch": signal_batch,
        "leave": changes.leave,
        "rejoin": changes.rejoin,
        "purge": changes.purge,
        "erase": changes.erase,
        "define_cohort": changes.define_cohort,
        "drop_cohort": changes.drop_cohort,
        "subscribe": groups.subscribe,  # the feed's, or a group's consumer's
        "unsubscribe": groups.unsubscribe,
        "status": reads.status,
        "counts": reads.counts,
        "cohorts": reads.cohorts,
        "history": reads.history,
        "left_users": reads.left_users,
        "count_left": reads.count_left,
        "partition_map": reads.partition_map,
        "ping": reads.ping,
        "stats": reads.stats,
        "health": reads.health,
        "top": ranked.top,
        "catalog": ranked.catalog,
        "group_create": groups.group_create,
        "group_drop": groups.group_drop,
        "group_reset": groups.group_reset,
        "groups": groups.groups,
        "ack": groups.ack,
        "nack": groups.nack,
        "dead_letters": groups.dead_letters,
        "redeliver": groups.redeliver,
        "receipt": groups.receipt,
        "unconfirmed": groups.unconfirmed,
        "rpc.discover": discover,
    }

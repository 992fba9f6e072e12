"""Cluster mode: how many partitions each live node serves, and what one node takes or
hands over to get there. Every node works it out alone from the same table; the database
settles a race (two nodes taking one partition: the second finds it taken)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence


def share(partitions: int, nodes: Sequence[str], node: str) -> int:
    """``node``'s fair share among ``nodes``: the first ``partitions % len(nodes)`` of them,
    in name order, serve one more than the rest."""
    ordered = sorted(nodes)
    base, extra = divmod(partitions, len(ordered))
    return base + (1 if ordered.index(node) < extra else 0)


def plan(
    live: Sequence[str], me: str, holders: Sequence[str | None], mine: set[int]
) -> tuple[list[int], list[int]]:
    """(partitions to take, partitions to hand over). ``holders``: each partition's node as
    the database says; ``mine``: those this node serves. A partition is free when no live
    node holds it, or when it is this node's in the table only (a previous run of it).
    A node takes free ones up to its share; past its share, it hands over only what the
    nodes short of theirs cannot find free."""
    nodes = sorted(set(live) | {me})
    target = share(len(holders), nodes, me)
    free = [
        p
        for p, node in enumerate(holders)
        if p not in mine and (node is None or node not in live or node == me)
    ]
    if len(mine) < target:
        start = nodes.index(me) * len(free) // len(nodes)  # nodes starting apart race less
        return (free[start:] + free[:start])[: target - len(mine)], []
    stale = [p for p, node in enumerate(holders) if node == me and p not in mine]
    held = Counter(node for node in holders if node is not None and node in live)
    short = sum(max(0, share(len(holders), nodes, n) - held[n]) for n in nodes if n != me)
    give = min(len(mine) - target, max(0, short - len(free) + len(stale)))
    return [], stale + sorted(mine)[len(mine) - give :]

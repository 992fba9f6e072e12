"""``tidal cluster status``: the cluster as its database holds it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import asyncpg

from .pg_cluster import LIVE, cluster_of


@dataclass(slots=True)
class NodeStatus:
    node: str
    live: bool
    partitions: int
    epochs: tuple[int, int] | None  # the lowest and highest epoch of its partitions
    applied: int  # the log id it last published (each tick)
    checkpoint: tuple[int, int] | None  # its newest checkpoint: (log id, at_ns)


@dataclass(slots=True)
class Status:
    """``tidal cluster status``: the cluster as its database holds it, one snapshot."""

    name: str
    partitions: int
    head: int  # the log's last id
    events: int
    log_rows: int
    log_first: int | None  # the oldest id kept
    nodes: list[NodeStatus]
    unserved: int  # partitions no live node holds


_NODE_STATUS: Final = f"""
    SELECT n.node, n.node IN ({LIVE}) AS live, n.applied,
        (SELECT COUNT(*) FROM tidal_partitions p WHERE p.node = n.node) AS partitions,
        (SELECT MIN(epoch) FROM tidal_partitions p WHERE p.node = n.node) AS low,
        (SELECT MAX(epoch) FROM tidal_partitions p WHERE p.node = n.node) AS high,
        c.log_id, c.at_ns
    FROM tidal_nodes n LEFT JOIN tidal_checkpoints c ON c.node = n.node
    ORDER BY n.node"""


def _span(first: int | None, second: int) -> tuple[int, int] | None:
    return None if first is None else (first, second)


async def read(conn: asyncpg.Connection) -> Status | None:
    """The cluster's nodes, partitions and log, read in one snapshot; None if the database
    holds no cluster. Reads only: it takes no lock a node waits on."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        if await cluster_of(conn) is None:
            return None
        row = await conn.fetchrow("SELECT name, partitions, log_id, events FROM tidal_cluster")
        assert row is not None  # cluster_of found it
        kept = await conn.fetchrow("SELECT COUNT(*), MIN(id) FROM tidal_log")
        assert kept is not None
        nodes = [
            NodeStatus(
                r["node"],
                r["live"],
                r["partitions"],
                _span(r["low"], r["high"]),
                r["applied"],
                _span(r["log_id"], r["at_ns"]),
            )
            for r in await conn.fetch(_NODE_STATUS)
        ]
    served = sum(n.partitions for n in nodes if n.live)
    return Status(
        row["name"], row["partitions"], row["log_id"], row["events"], kept[0], kept[1], nodes,
        row["partitions"] - served,
    )  # fmt: skip

"""Cluster mode's room: a node's tick, which takes and hands over partitions (``node``),
its upkeep of the shared tables after each tick (``upkeep``: checkpoints, pruning,
merging blocks), and its reading of the commit log as the other nodes write it
(``follow``).

The rest of cluster mode lives in the layers it belongs to, imports going down as
everywhere: the board and cohorts applied from the log (``engine.replica``), the
partitions a node owns and the gate's check of them (``core.owners``), the log's
records (``core.log``), its tables and statements (``storage.postgres.pg_cluster``), and
the clients' routing (``client.routing``, ``client.cluster``, ``client.sync_cluster``).
docs/SCALING.md says how it works.
"""

from .node import Node as Node

"""The fault-history checker: random operations from many connections under a nemesis
(kill -9, SIGTERM, SIGSTOP, PostgreSQL restarted, a hung proxy to it, a full disk, a
standby taking over), and a checker of the whole history after every fault (tests/history/).

``make test`` runs a few faults per backend, each run with a new seed, printed;
``make history`` runs 200 (TIDAL_HISTORY_FAULTS); TIDAL_HISTORY_NEMESIS names the faults.
TIDAL_HISTORY_SEED replays a run's choices (not its timing).
"""

from __future__ import annotations

import contextlib
import os
import random
from pathlib import Path

import pytest

from tidal.testing.postgres import Cluster

from .conftest import Database, tmpfs
from .history import cluster, nemesis
from .history.run import run

FAULTS = int(os.environ.get("TIDAL_HISTORY_FAULTS", "25"))
#: the faults drawn from, those the backend has: all of them, unless named
NEMESIS = os.environ.get("TIDAL_HISTORY_NEMESIS", ",".join(nemesis.NEMESIS)).split(",")
#: about what the workload's aggregates take at their most: writes that would create
#: aggregates are refused now and then (``full:``), and purges and erasures make room
BUDGET = os.environ.get("TIDAL_HISTORY_BUDGET", "40K")
#: ... and for three nodes (``history.cluster``)
CLUSTER_FAULTS = int(os.environ.get("TIDAL_HISTORY_CLUSTER_FAULTS", "12"))
CLUSTER_NEMESIS = os.environ.get("TIDAL_HISTORY_CLUSTER_NEMESIS", ",".join(cluster.NEMESIS)).split(
    ","
)
pytestmark = pytest.mark.timeout(max(600, max(FAULTS, CLUSTER_FAULTS) * 60))


def seed() -> int:
    return int(os.environ.get("TIDAL_HISTORY_SEED") or random.SystemRandom().randrange(2**32))


@pytest.mark.both_backends
async def test_every_history_under_faults_is_exact(
    database: Database, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    pg: Cluster | None = None
    chosen = seed()
    print(f"history seed {chosen}")
    with contextlib.ExitStack() as stack:
        disk = None
        if database.backend == "postgresql":
            pg = request.getfixturevalue("pg_cluster")
        else:  # the file on a file system of its own, for the nemesis to fill
            disk = stack.enter_context(tmpfs(tmp_path / "disk", "256m"))
            database = Database("sqlite", str(disk / "tidal.db"))
        # a checkpoint every 500 signals, and a purge's rows rewritten 2 a commit: more faults
        # land while a checkpoint or a rewrite is under way (issue 39's first item showed so)
        summary = await run(database, chosen, FAULTS, NEMESIS, "--checkpoint-signals", "500",
                            "--rewrite-chunk", "2", "--memory-budget", BUDGET, pg=pg,
                            standby=database.backend == "postgresql", disk=disk)  # fmt: skip
    print(summary)


@pytest.mark.parametrize("backend", ["postgresql"])
async def test_every_cluster_history_under_faults_is_exact(
    database: Database, request: pytest.FixtureRequest
) -> None:
    """Three nodes (``history.cluster``): nodes killed, stopped, paused past their session,
    added and removed, PostgreSQL restarted, all under load through every node."""
    chosen = seed()
    print(f"history seed {chosen}")
    pg: Cluster = request.getfixturevalue("pg_cluster")
    # no memory budget: a node holds every node's aggregates, and bounds what it accepts
    # itself only (docs/SCALING.md)
    summary = await run(database, chosen, CLUSTER_FAULTS, CLUSTER_NEMESIS, "--rewrite-chunk", "2",
                        pg=pg, cluster=True)  # fmt: skip
    print(summary)

"""The fault-history checker: random operations from many connections under a nemesis
(kill -9, SIGTERM, SIGSTOP, PostgreSQL restarted, a standby taking over), and a checker of
the whole history after every fault (tests/history/).

``make test`` runs a few faults per backend, each run with a new seed, printed;
``make history`` runs 200 (TIDAL_HISTORY_FAULTS), PostgreSQL restarts included
(TIDAL_HISTORY_NEMESIS). TIDAL_HISTORY_SEED replays a run's choices (not its timing).
"""

from __future__ import annotations

import os
import random

import pytest

from tidal.testing.postgres import Cluster

from .conftest import Database
from .history.run import Anomalies, run

FAULTS = int(os.environ.get("TIDAL_HISTORY_FAULTS", "25"))
#: the faults drawn from: PostgreSQL restarted under load (pg_restart) still finds a rare
#: anomaly (docs/RELIABILITY.md), so ``make test`` leaves it out and ``make history`` has it
NEMESIS = os.environ.get("TIDAL_HISTORY_NEMESIS", "kill9,term,pause").split(",")
pytestmark = pytest.mark.timeout(max(600, FAULTS * 60))


def seed() -> int:
    return int(os.environ.get("TIDAL_HISTORY_SEED") or random.SystemRandom().randrange(2**32))


#: Issue 39's first item, found by this checker and not fixed yet: in 1 of 14 runs here and
#: 2 of 3 in fresh clones, on SQLite (and after PostgreSQL restarts), a kill -9 leaves
#: memory off the ledger: counts
#: below a recompute, stats.ledger_rows 502 against 650 rows, purges not applied. Until it
#: is fixed, ``make test`` reports such a run as xfailed (with its anomalies) rather than
#: failing; ``make history`` (TIDAL_HISTORY_STRICT=1) fails on any anomaly.
KNOWN_OPEN = pytest.mark.xfail(
    os.environ.get("TIDAL_HISTORY_STRICT") != "1",
    reason="issue 39 item 1: memory drifts from the ledger after some kill -9s (open)",
    raises=Anomalies,
    strict=False,
)


@pytest.mark.both_backends
@KNOWN_OPEN
async def test_every_history_under_faults_is_exact(
    database: Database, request: pytest.FixtureRequest
) -> None:
    pg: Cluster | None = None
    if database.backend == "postgresql":
        pg = request.getfixturevalue("pg_cluster")
    chosen = seed()
    print(f"history seed {chosen}")
    summary = await run(database, chosen, FAULTS, NEMESIS, "--checkpoint-signals", "500",
                        pg=pg, standby=database.backend == "postgresql")  # fmt: skip
    print(summary)

"""The engine as the settings make it, and the line that says what boot loaded: the
start of ``app``'s boot, apart from its order of steps."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from tidal.server.core.owners import Owners
from tidal.server.engine.engine import Engine
from tidal.server.storage.interface import Snapshot, Storage

from . import host
from .config import Config
from .metrics import Metrics

log = logging.getLogger("tidal.server")


def build_engine(
    config: Config,
    storage: Storage,
    snapshot: Snapshot,
    *,
    metrics: Metrics | None,
    clock: Callable[[], int],
    connections: Callable[[], int],
    hold: Callable[[bool], None],
    owners: Owners | None,
) -> Engine:
    return Engine(
        storage,
        snapshot,
        metrics=metrics,
        clock=clock,
        connections=connections,
        checkpoint_signals=config.checkpoint_signals,
        checkpoint_seconds=config.checkpoint_seconds,
        key_window_ns=int(config.idempotency_window * 1e9),
        max_keys=config.idempotency_max_keys,
        hold=hold,
        max_reply=config.max_message_size,
        ledger_retention=config.ledger_retention,
        event_retention=config.event_retention,
        heartbeat=config.feed_heartbeat,
        rewrite_chunk=config.rewrite_chunk,
        owners=owners,
        memory_budget=(host.budget_bytes(config.memory_budget), config.memory_budget),
    )


def loaded(
    storage: Storage, snapshot: Snapshot, engine: Engine, seconds: tuple[float, float, float]
) -> None:
    """``seconds``: the whole boot, reading the database, building memory."""
    limit = engine.budget.limit
    log.info(
        "loaded %s in %.3fs (%.3fs reading it, %.3fs building memory): %d leave records,"
        " %d cohorts, next seq %d, %d ledger rows replayed past the aggregates checkpoint,"
        " %d aggregates ranked (%s; the memory budget: %s)",
        storage.location, *seconds,
        len(snapshot.left) + len(snapshot.rejoined),
        len(snapshot.cohorts),
        snapshot.next_seq,
        len(snapshot.ledger_tail),
        engine.board.tallies,
        f"{engine.budget.used() / 2**20:.1f} MiB",
        "none" if limit == sys.maxsize else f"{limit / 2**20:.1f} MiB",
    )  # fmt: skip

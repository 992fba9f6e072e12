"""The metrics read from the engine at each scrape, from the metrics' own thread: what
memory holds (the aggregates and their budget), who has left and who follows the feed,
and what is stored. The engine is read by its shape (``Engine``), never imported: the
engine imports the metrics."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sized
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from .group_metrics import Groups


class Backend(Protocol):
    @property
    def backend(self) -> str: ...

    def size(self) -> int: ...  # the database's bytes, as last measured


class Feed(Protocol):
    sent: int
    lagged: int
    last_id: int

    def __len__(self) -> int: ...


class Budget(Protocol):
    limit: int
    refused: int

    def used(self) -> int: ...

    def full(self) -> bool: ...


class Partitions(Protocol):
    owned: dict[int, int]
    map: list[tuple[str | None, int]]


class Engine(Protocol):
    """The engine, as the metrics read it: a shape, as the engine imports the metrics."""

    @property
    def signals(self) -> int: ...

    @property
    def forwarded(self) -> int: ...

    @property
    def members(self) -> Sized: ...  # the users who have left

    @property
    def storage(self) -> Backend: ...

    @property
    def health(self) -> Callable[[], dict[str, Any]]: ...

    @property
    def feed(self) -> Feed: ...

    @property
    def tallies(self) -> int: ...  # aggregates held on the board

    @property
    def ledger_rows(self) -> int: ...

    @property
    def owners(self) -> Partitions | None: ...  # cluster mode's

    @property
    def budget(self) -> Budget: ...

    @property
    def groups(self) -> Groups: ...


def _memory(engine: Engine | None) -> Iterator[Metric]:
    """The aggregates, and the memory budget they are held to."""
    budget = engine.budget if engine else None
    yield GaugeMetricFamily(
        "tidal_aggregates", "Aggregates held in memory.", value=engine.tallies if engine else 0
    )
    yield GaugeMetricFamily(
        "tidal_aggregates_bytes",
        "Memory the aggregates take, as the memory budget counts it.",
        value=budget.used() if budget else 0,
    )
    yield GaugeMetricFamily(
        "tidal_memory_budget_bytes",
        "The memory budget of the aggregates (--memory-budget); 0: no budget.",
        value=budget.limit if budget and budget.limit < 2**62 else 0,
    )
    yield GaugeMetricFamily(
        "tidal_memory_full",
        "1 while less than 1% of the memory budget is left: writes that would create"
        " aggregates are refused.",
        value=int(budget.full()) if budget else 0,
    )
    yield counter(
        "tidal_writes_refused_full",
        "Writes refused for the memory budget (error 2 'full:').",
        budget.refused if budget else 0,
    )


def _users(engine: Engine | None) -> Iterator[Metric]:
    """Users who have left, and the change feed's subscribers."""
    users_left = len(engine.members) if engine else 0
    yield GaugeMetricFamily("tidal_users_left", "Users who have left now.", value=users_left)
    feed = engine.feed if engine else None
    yield GaugeMetricFamily(
        "tidal_subscribers", "Change feed subscribers now.", value=len(feed) if feed else 0
    )
    sent = feed.sent if feed else 0
    yield counter("tidal_events_sent", "Change feed events written to subscribers.", sent)
    yield counter(
        "tidal_subscribers_lagging",
        "Subscribers closed for lagging: too much written to them still unread.",
        feed.lagged if feed else 0,
    )


def engine_metrics(engine: Engine | None) -> Iterator[Metric]:
    """Every family read from the engine (None while the database loads)."""
    yield from _memory(engine)
    yield from _users(engine)
    yield from _stored(engine)
    yield from _partitions(engine.owners if engine else None)


def _partitions(owners: Partitions | None) -> Iterator[Metric]:
    """Cluster mode: the partitions this node serves, and those no live node served at its
    last read of the partition table (0 on one tidal, which serves every user)."""
    yield GaugeMetricFamily(
        "tidal_cluster_partitions_owned",
        "Cluster mode: partitions this node serves now.",
        value=len(owners.owned) if owners else 0,
    )
    unserved = sum(node is None for node, _ in owners.map) if owners else 0
    yield GaugeMetricFamily(
        "tidal_cluster_partitions_unserved",
        "Cluster mode: partitions no live node served at this node's last read of the"
        " partition table (each node reads it every 0.5 s).",
        value=unserved,
    )


def _stored(engine: Engine | None) -> Iterator[Metric]:
    """What the database holds, as the engine knows it."""
    yield GaugeMetricFamily(
        "tidal_ledger_rows", "Rows the ledger keeps now.", value=engine.ledger_rows if engine else 0
    )
    yield GaugeMetricFamily(
        "tidal_database_bytes",
        "The database's size on disk (SQLite: the file and its WAL; PostgreSQL: the"
        " database), as last measured.",
        value=engine.storage.size() if engine else 0,
    )
    yield GaugeMetricFamily(
        "tidal_last_event_id",
        "The change feed's last event id (in cluster mode: the last this node applied).",
        value=engine.feed.last_id if engine else 0,
    )


def counter(name: str, doc: str, value: int) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)

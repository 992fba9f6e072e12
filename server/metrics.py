"""Prometheus metrics: counted on the request path with plain integers, rendered when scraped.

prometheus-client's own Histogram takes a lock and several calls per
observation; the loop thread is the only writer here, so a bisect and two
additions do, and a collector turns them into metric families at scrape time.
"""

from __future__ import annotations

import socket
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sized
from typing import Any, Final, Protocol
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import (
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    make_wsgi_app,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector, CollectorRegistry

from tidal.protocol import METHODS

from .group_metrics import Groups, group_metrics


class Backend(Protocol):
    @property
    def backend(self) -> str: ...


class Feed(Protocol):
    sent: int
    lagged: int

    def __len__(self) -> int: ...


class Budget(Protocol):
    limit: int
    refused: int

    def used(self) -> int: ...

    def full(self) -> bool: ...


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
    def budget(self) -> Budget: ...

    @property
    def groups(self) -> Groups: ...


LATENCY_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
BATCH_BUCKETS: Final = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)
COMMIT_BUCKETS: Final = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)


class Histogram:
    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def buckets(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
        return out


class Metrics:
    """What the server counts; live state (users left, health) is read from the engine,
    which is None while the database loads."""

    def __init__(self) -> None:
        self.errors: dict[int, int] = {}
        self.leaves = 0
        self.rejoins = 0
        self.latency: dict[str, Histogram] = {}
        self.batch_size = Histogram(BATCH_BUCKETS)
        self.commit_seconds = Histogram(COMMIT_BUCKETS)
        self.engine: Callable[[], Engine | None] = lambda: None
        self.connections: Callable[[], int] = lambda: 0

    def serve(self, host: str, port: int) -> Any:
        """prometheus-client's HTTP server for ``registry()``, on its own thread: scrapes
        never wait on the loop. Raises ``OSError`` if it cannot listen."""
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]

        class Server(ThreadingWSGIServer):
            address_family = family

        app = _only(PATH, make_wsgi_app(self.registry()))
        server = make_server(host, port, app, Server, handler_class=_Quiet)
        threading.Thread(target=server.serve_forever, name="tidal-metrics", daemon=True).start()
        return server

    def bind(self, engine: Callable[[], Engine | None], connections: Callable[[], int]) -> None:
        self.engine, self.connections = engine, connections

    def observe_latency(self, method: str, seconds: float) -> None:
        """Labelled by method for tidal's methods only: any other name a client sends is
        ``other``, so that no stranger adds series to every scrape."""
        if method not in METHODS:
            method = "other"
        histogram = self.latency.get(method)
        if histogram is None:
            histogram = self.latency[method] = Histogram(LATENCY_BUCKETS)
        histogram.observe(seconds)

    def error(self, code: int) -> None:
        self.errors[code] = self.errors.get(code, 0) + 1

    def registry(self) -> CollectorRegistry:
        """tidal's metrics, and prometheus-client's own: process_* (CPU, memory, open
        files), python_gc_* and python_info."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(self))
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
        return registry


class _Collector(Collector):
    def __init__(self, metrics: Metrics) -> None:
        self.m = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.m
        engine = m.engine()
        signals, forwarded = (engine.signals, engine.forwarded) if engine else (0, 0)
        storage = engine.health()["storage"] if engine else "loading"
        yield GaugeMetricFamily(
            "tidal_ready",
            "1 once the database is loaded and requests are served.",
            value=int(engine is not None),
        )
        yield GaugeMetricFamily(
            "tidal_storage_up",
            "1 while storage takes writes; 0 while loading, after a failed commit, with the"
            " disk full, or with the database out of reach.",
            value=int(storage == "ok"),
        )
        if engine is not None:
            backend = GaugeMetricFamily(
                "tidal_storage_backend", "The storage backend in use: 1.", labels=["backend"]
            )
            backend.add_metric([engine.storage.backend], 1)
            yield backend
        yield from _traffic(m, signals, forwarded)
        yield GaugeMetricFamily("tidal_connections", "Open connections.", value=m.connections())
        yield from _memory(engine)
        yield from _users(engine)
        yield from group_metrics(engine.groups if engine else None)


def _traffic(m: Metrics, signals: int, forwarded: int) -> Iterator[Metric]:
    """What came in and what was answered: signals, leaves, errors, latencies, commits."""
    yield _counter("tidal_signals", "Signals committed to the ledger.", signals)
    yield _counter("tidal_forwarded", "Signals fanned out to cohorts and communities.", forwarded)
    yield _counter(
        "tidal_gated", "Signals of users who had left: ledger only.", signals - forwarded
    )
    yield _counter("tidal_leaves", "Leaves committed.", m.leaves)
    yield _counter("tidal_rejoins", "Rejoins committed.", m.rejoins)
    errors = CounterMetricFamily("tidal_errors", "Error replies, by code.", labels=["code"])
    for code, count in sorted(m.errors.items()):
        errors.add_metric([str(code)], count)
    yield errors
    latency = HistogramMetricFamily(
        "tidal_request_seconds",
        "From reading a request to writing its reply, by method.",
        labels=["method"],
    )
    for method, histogram in sorted(m.latency.items()):
        latency.add_metric([method], histogram.buckets(), histogram.total)
    yield latency
    yield _histogram("tidal_commit_batch_size", "Writes per group commit.", m.batch_size)
    yield _histogram("tidal_commit_seconds", "Duration of a group commit.", m.commit_seconds)


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
    yield _counter(
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
    yield _counter("tidal_events_sent", "Change feed events written to subscribers.", sent)
    yield _counter(
        "tidal_subscribers_lagging",
        "Subscribers closed for lagging: too much written to them still unread.",
        feed.lagged if feed else 0,
    )


def _counter(name: str, doc: str, value: int) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _histogram(name: str, doc: str, histogram: Histogram) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, buckets=histogram.buckets(), sum_value=histogram.total)


#: the one path the metrics port serves; every other one is 404, as a scraper or a person
#: who mistyped it should be told (prometheus-client answers 200 with the metrics on any)
PATH: Final = "/metrics"


def _only(path: str, app: Any) -> Any:
    def serve(environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("PATH_INFO") != path:
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [f"not found: tidal's metrics are at {path}\n".encode()]
        return app(environ, start_response)

    return serve


class _Quiet(WSGIRequestHandler):
    """No line per scrape on stderr."""

    def log_message(self, format: str, *args: Any) -> None:
        pass
